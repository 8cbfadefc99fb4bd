"""The daemon's front-end workers (the ``workers`` setting): ``W`` processes accept the HTTP port's
connections on one listening socket the daemon binds and shares, and do the HTTP/1.1 framing of lane
requests on their own cores (``appliance.workers.worker``); the daemon answers every request they send
with the same ``InferLane.answer`` its own connections use (so admission, the models' schedulers, batching
and sequences stay one and box-wide), and serves the connections they hand over with its aiohttp.

- **Connections**: the HTTP ports' cap is counted over the daemon and every worker in one shared page
  (``appliance.protocol.connections.ConnectionPage``).
- **Start**: the port is served once every worker says it accepts (a worker that cannot start fails the
  daemon's start, with its exit code; its own log says why).
- **Crashes**: a worker that exits while the daemon serves is restarted (after 0.5 s, doubling to 30 s
  while it keeps dying within 10 s of its start); its connections and requests die with it, its counter
  is zeroed, and the requests it had sent are cancelled. Each run of a worker has its own link and
  requests, so nothing of a dead one reaches its successor.
- **What a worker sends** is checked: frames bounded, no classes unpickled, every message's shape and
  a body's length against its head; a worker that breaks a rule loses its link (and is restarted).
- **Stop**: the daemon stops listening, every worker stops accepting and gets until the daemon's deadline
  to finish what it holds; the daemon answers it meanwhile; one that has not exited a second past the
  deadline is killed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
import time
from collections.abc import Callable

from appliance.core.errors import ConfigError
from appliance.protocol.connections import ConnectionPage, ProtocolWrapper
from appliance.rest.lane import InferLane
from appliance.rest.lane_connection import LANE_REQUEST_BYTES
from appliance.workers.handoff import Receiver, handoff_pair
from appliance.workers.link import Link
from appliance.workers.messages import ANSWER, BODY, CANCEL, READY, REQUEST, STOP, lane_head

__all__ = ["WorkerPool"]

log = logging.getLogger(__name__)

_BACKLOG = 1024
_FIRST_BACKOFF, _MAX_BACKOFF, _STABLE = 0.5, 30.0, 10.0
_KILL_GRACE = 1.0
_START_TIMEOUT = 60.0  # a worker imports the lane and binds its loop: seconds, on a loaded box
_FRAME_SLACK = 64 << 10  # a request frame's fields beside its head and body


class _Run:
    """One run of a worker's process: its link, hand-over socket, and the requests it has sent (their ids
    are its own: a successor's start again at 0)."""

    def __init__(self, index: int, process: asyncio.subprocess.Process) -> None:
        self.index = index
        self.process = process
        self.started = time.monotonic()
        self.link: Link | None = None
        self.receiver: Receiver | None = None
        self.requests: dict[int, asyncio.Task] = {}
        self.bodies: dict[int, asyncio.Future[bytes]] = {}
        """The bodies of requests sent ahead of them, until they come."""
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    def send(self, message: tuple) -> None:
        if self.link is not None:
            self.link.send(message)

    def broke(self, why: object) -> None:
        """The worker broke a rule of the link: it loses the link (and ends, and is restarted)."""
        log.error("front-end worker %d sent %s: closing its link", self.index, why)
        if self.link is not None:
            self.link.close()

    def end(self) -> None:
        """The process is gone: its requests are cancelled, its sockets closed."""
        for task in self.requests.values():
            task.cancel()
        self.requests.clear()
        for body in self.bodies.values():
            body.cancel()
        self.bodies.clear()
        if self.link is not None:
            self.link.close()
            self.link = None
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None


class WorkerPool:
    """``count`` front-end workers for one HTTP port. ``page``: the connection page the daemon's own
    HTTP limiter counts into as process 0 (make the limiter with it before ``start``)."""

    def __init__(self, count: int, *, header_timeout: float, body_timeout: float, max_body: int,
                 connection_limit: int, event_loop: str) -> None:
        if count < 1:
            raise ValueError(f"a worker pool has at least one worker, got {count}")
        self.page = ConnectionPage.create(count + 1)
        self._spec = {"header_timeout": header_timeout, "body_timeout": body_timeout, "max_body": max_body,
                      "limit": connection_limit, "processes": count + 1, "page": self.page.fd,
                      "event_loop": event_loop}
        self._count = count
        self._runs: dict[int, _Run] = {}
        self._listening: socket.socket | None = None
        self._lane: InferLane | None = None
        self._fallback: Callable[[], asyncio.Protocol] | None = None
        self._supervisors: list[asyncio.Task] = []
        self._handing: set[asyncio.Task] = set()
        self._stopping = False

    @property
    def sockets(self) -> list[socket.socket]:
        """The listening socket (as a server's ``sockets``, for aiohttp's runner's addresses)."""
        return [self._listening] if self._listening is not None else []

    def close(self) -> None:
        """The daemon stops listening (aiohttp's site stop); each worker closes its copy at ``stop``."""
        if self._listening is not None:
            self._listening.close()
            self._listening = None

    def bind(self, host: str, port: int) -> int:
        """Bind and listen on ``host:port`` (0: a free port; a name: the first address it resolves to, as
        one socket); the port bound."""
        family, kind, proto, _, address = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        listening = socket.socket(family, kind, proto)
        try:
            listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio's servers: IPv4 clients keep their own addresses
                listening.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            listening.bind(address)
            listening.listen(_BACKLOG)
        except OSError:
            listening.close()
            raise
        listening.setblocking(False)
        self._listening = listening
        return listening.getsockname()[1]

    async def start(self, lane: InferLane, fallback: Callable[[], asyncio.Protocol]) -> None:
        """Start every worker and wait until each accepts: their lane requests are answered by ``lane``,
        the connections they hand over are served by ``fallback``'s protocols (aiohttp's, through the HTTP
        ports' limiter). ConfigError when a worker cannot start."""
        assert self._listening is not None, "bind before start"
        self._lane, self._fallback = lane, fallback
        for index in range(1, self._count + 1):
            run = await self._spawn(index)
            exited = asyncio.ensure_future(run.process.wait())
            done, _ = await asyncio.wait((run.ready, exited), timeout=_START_TIMEOUT,
                                         return_when=asyncio.FIRST_COMPLETED)
            if not run.ready.done():
                exited.cancel()
                if run.alive:
                    run.process.kill()
                    await run.process.wait()
                run.end()
                raise ConfigError(f"front-end worker {index} did not start (exit code {run.process.returncode}; "
                                  "its log above says why): fix that, or set workers to 0")
            exited.cancel()
            self._supervisors.append(asyncio.create_task(self._supervise(index), name=f"worker-{index}"))

    async def _spawn(self, index: int) -> _Run:
        loop = asyncio.get_running_loop()
        assert self._listening is not None
        link_ours, link_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        hand_ours, hand_theirs = handoff_pair()
        spec = dict(self._spec, index=index, link=link_theirs.fileno(), handoff=hand_theirs.fileno(),
                    listen=self._listening.fileno(), log_level=logging.getLogger().getEffectiveLevel())
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "appliance.workers.worker", json.dumps(spec),
                pass_fds=(link_theirs.fileno(), hand_theirs.fileno(), self._listening.fileno(), self.page.fd),
                stdin=asyncio.subprocess.DEVNULL,
            )
        except BaseException:
            link_ours.close()
            hand_ours.close()
            raise
        finally:
            link_theirs.close()
            hand_theirs.close()
        run = self._runs[index] = _Run(index, process)
        try:
            _, run.link = await loop.connect_accepted_socket(
                lambda: Link(lambda message: self._on_message(run, message),
                             max_frame=LANE_REQUEST_BYTES + _FRAME_SLACK),
                link_ours,
            )
            run.receiver = Receiver(hand_ours, self._serve_handed)
            run.receiver.start()
        except BaseException:
            link_ours.close()
            hand_ours.close()
            process.kill()
            await process.wait()
            raise
        log.debug("front-end worker %d started (pid %d)", index, process.pid)
        return run

    async def _supervise(self, index: int) -> None:
        backoff = _FIRST_BACKOFF
        while True:
            run = self._runs[index]
            code = await run.process.wait()
            run.end()
            self.page.set(index, 0)
            if self._stopping:
                return
            lived = time.monotonic() - run.started
            backoff = _FIRST_BACKOFF if lived > _STABLE else min(backoff * 2, _MAX_BACKOFF)
            log.warning("front-end worker %d exited (code %s) after %.1f s: its connections are lost; restarting "
                        "it in %.1f s", index, code, lived, backoff)
            while True:
                await asyncio.sleep(backoff)
                if self._stopping or self._listening is None:
                    return
                try:
                    await self._spawn(index)
                    break
                except Exception as exc:  # out of processes or descriptors, say: try again, later
                    backoff = min(backoff * 2, _MAX_BACKOFF)
                    log.error("cannot restart front-end worker %d (%s): trying again in %.1f s", index, exc,
                              backoff)

    def _on_message(self, run: _Run, message: tuple) -> None:
        try:
            kind = message[0]
            if kind == REQUEST:
                _, request, fields, body, peer, local = message
                if not isinstance(request, int) or not isinstance(body, (bytes, type(None))) or \
                        not isinstance(peer, (str, type(None))) or not isinstance(local, (str, type(None))):
                    raise TypeError("a request of the wrong types")
                loop = asyncio.get_running_loop()
                # Its body's future is there before the next message is read: that may be the body.
                coming: asyncio.Future[bytes] | None = None
                if body is None:
                    coming = run.bodies[request] = loop.create_future()
                run.requests[request] = loop.create_task(
                    self._answer(run, request, fields, body, coming, peer, local))
            elif kind == BODY:
                _, request, data = message
                if not isinstance(data, bytes):
                    raise TypeError("a body that is no bytes")
                waiting = run.bodies.pop(request, None)
                if waiting is not None and not waiting.done():
                    waiting.set_result(data)
            elif kind == CANCEL:
                _, request = message
                cancelled = run.requests.pop(request, None)
                if cancelled is not None:
                    cancelled.cancel()
                body_future = run.bodies.pop(request, None)  # a task cancelled before it ran cleans nothing up
                if body_future is not None:
                    body_future.cancel()
            elif kind == READY:
                if not run.ready.done():
                    run.ready.set_result(None)
            else:
                raise ValueError(f"a message of no known kind ({kind!r})")
        except (ValueError, TypeError, IndexError) as exc:
            run.broke(exc)

    async def _answer(self, run: _Run, request: int, fields: tuple, body: bytes | None,
                      coming: asyncio.Future[bytes] | None, peer: str | None, local: str | None) -> None:
        assert self._lane is not None
        try:
            try:
                head = lane_head(fields)
            except (ValueError, TypeError) as exc:
                run.broke(f"a malformed request ({exc})")
                return

            async def whole() -> bytes:
                data = await coming if coming is not None else body
                assert data is not None
                if len(data) != head.length:
                    run.broke(f"a body of {len(data)} bytes for a head that says {head.length}")
                    raise asyncio.CancelledError
                return data

            reply, close = await self._lane.answer(head, whole, peer, local, coming is None)
        finally:
            run.requests.pop(request, None)
            run.bodies.pop(request, None)
        run.send((ANSWER, request, reply, close or self._stopping))

    def _serve_handed(self, sock: socket.socket, pending: bytes) -> None:
        """Serve a connection a worker handed over, from ``pending`` on, with aiohttp's protocol."""
        fallback = self._fallback
        assert fallback is not None
        task = asyncio.get_running_loop().create_task(_serve_from(sock, fallback(), pending))
        self._handing.add(task)
        task.add_done_callback(self._handing.discard)

    async def stop(self, deadline: float) -> None:
        """Stop listening; workers stop accepting and get until ``deadline`` (``time.monotonic()``) to
        finish; then killed."""
        self._stopping = True
        self.close()
        seconds = max(deadline - time.monotonic(), 0.0)
        runs = [run for run in self._runs.values() if run.alive]
        for run in runs:
            run.send((STOP, seconds))
        if runs:
            await asyncio.wait([asyncio.ensure_future(run.process.wait()) for run in runs],
                               timeout=seconds + _KILL_GRACE)
        for supervisor in self._supervisors:
            supervisor.cancel()
        await asyncio.gather(*self._supervisors, return_exceptions=True)
        for run in self._runs.values():  # those that did not stop in time, and any started meanwhile
            if run.alive:
                log.warning("front-end worker %d had not stopped by the deadline: killed", run.index)
                run.process.kill()
                await run.process.wait()
            run.end()
        for task in list(self._handing):
            task.cancel()
        await asyncio.gather(*self._handing, return_exceptions=True)
        # The page stays: the daemon's HTTP limiter counts into it until its last connection closes.


async def _serve_from(sock: socket.socket, protocol: asyncio.Protocol, pending: bytes) -> None:
    try:
        await asyncio.get_running_loop().connect_accepted_socket(lambda: _Resumed(protocol, pending), sock)
    except OSError as exc:  # the client left on the way
        log.debug("a handed-over connection could not be served: %s", exc)
        sock.close()


class _Resumed(ProtocolWrapper):
    """A protocol that starts from the bytes another process read of its connection (``pending``)."""

    __slots__ = ("_pending",)

    def __init__(self, inner: asyncio.Protocol, pending: bytes) -> None:
        super().__init__(inner)
        self._pending = pending

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)
        pending, self._pending = self._pending, b""
        if pending:
            self._inner.data_received(pending)
