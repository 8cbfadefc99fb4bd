"""The daemon's front-end workers (the ``workers`` setting): ``W`` processes accept the HTTP port's
connections on one listening socket the daemon binds and shares, and do the HTTP/1.1 framing of lane
requests on their own cores (``appliance.workers.worker``); the daemon answers every request they send
with the same ``InferLane.answer`` its own connections use (so admission, the models' schedulers, batching
and sequences stay one and box-wide), and serves the connections they hand over with its aiohttp.

- **Connections**: the HTTP ports' cap is counted over the daemon and every worker in one shared page
  (``appliance.protocol.connections.ConnectionPage``).
- **Crashes**: a worker that exits while the daemon serves is restarted (after 0.5 s, doubling to 30 s
  while it keeps dying within 10 s of its start); its connections and requests die with it, its counter
  is zeroed, and the requests it had sent are cancelled.
- **Stop**: every worker stops accepting and gets until the daemon's deadline to finish what it holds;
  the daemon answers it meanwhile; one that has not exited a second past the deadline is killed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
import time
from collections.abc import Callable

from appliance.protocol.connections import ConnectionPage, ProtocolWrapper
from appliance.rest.lane import InferLane
from appliance.rest.lane_connection import LANE_REQUEST_BYTES
from appliance.workers.handoff import Receiver, handoff_pair
from appliance.workers.link import Link
from appliance.workers.messages import ANSWER, BODY, CANCEL, REQUEST, STOP, lane_head

__all__ = ["WorkerPool", "worker_count"]

log = logging.getLogger(__name__)

_BACKLOG = 1024
_FIRST_BACKOFF, _MAX_BACKOFF, _STABLE = 0.5, 30.0, 10.0
_KILL_GRACE = 1.0
_FRAME_SLACK = 64 << 10  # a request frame's fields beside its head and body


def worker_count(setting: int | None) -> int:
    """The workers to start: ``setting`` when set, else none. Measured (docs/performance.md, "Front-end
    workers"): a worker takes the HTTP framing off the daemon, about 7 % of the daemon's CPU per request,
    and adds more than that in its own process and the hop, so none is the default on every box."""
    return setting if setting is not None else 0


class _Worker:
    """One worker process, its link and hand-over socket, and the requests it has sent."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.process: asyncio.subprocess.Process | None = None
        self.link: Link | None = None
        self.receiver: Receiver | None = None
        self.requests: dict[int, asyncio.Task] = {}
        self.bodies: dict[int, asyncio.Future[bytes]] = {}
        """The bodies of requests sent ahead of them, until they come."""
        self.started = 0.0

    def forget(self) -> None:
        """The process is gone: its requests are cancelled, its sockets closed."""
        for task in self.requests.values():
            task.cancel()
        self.requests.clear()
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
        self._workers = [_Worker(i + 1) for i in range(count)]
        self._listening: socket.socket | None = None
        self._lane: InferLane | None = None
        self._fallback: Callable[[], asyncio.Protocol] | None = None
        self._supervisors: list[asyncio.Task] = []
        self._handing: set[asyncio.Task] = set()
        self._stopping = False
        self.restarts = 0
        """Workers restarted after exiting on their own."""

    @property
    def sockets(self) -> list[socket.socket]:
        """The listening socket (as a server's ``sockets``, for aiohttp's runner's addresses)."""
        return [self._listening] if self._listening is not None else []

    def close(self) -> None:
        """The daemon stops listening (aiohttp's site stop); the workers stop in ``stop``."""

    def bind(self, host: str, port: int) -> int:
        """Bind and listen on ``host:port`` (0: a free port); the port bound."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listening = socket.socket(family, socket.SOCK_STREAM)
        try:
            listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listening.bind((host, port))
            listening.listen(_BACKLOG)
        except OSError:
            listening.close()
            raise
        listening.setblocking(False)
        self._listening = listening
        return listening.getsockname()[1]

    async def start(self, lane: InferLane, fallback: Callable[[], asyncio.Protocol]) -> None:
        """Start every worker: their lane requests are answered by ``lane``, the connections they hand over
        are served by ``fallback``'s protocols (aiohttp's, through the HTTP ports' limiter)."""
        assert self._listening is not None, "bind before start"
        self._lane, self._fallback = lane, fallback
        for worker in self._workers:
            await self._spawn(worker)
            self._supervisors.append(asyncio.create_task(self._supervise(worker), name=f"worker-{worker.index}"))

    async def _spawn(self, worker: _Worker) -> None:
        loop = asyncio.get_running_loop()
        assert self._listening is not None
        link_ours, link_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        hand_ours, hand_theirs = handoff_pair()
        spec = dict(self._spec, index=worker.index, link=link_theirs.fileno(), handoff=hand_theirs.fileno(),
                    listen=self._listening.fileno(), log_level=logging.getLogger().getEffectiveLevel())
        try:
            worker.process = await asyncio.create_subprocess_exec(
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
        worker.started = time.monotonic()
        _, worker.link = await loop.connect_accepted_socket(
            lambda: Link(lambda message: self._on_message(worker, message),
                         max_frame=LANE_REQUEST_BYTES + _FRAME_SLACK),
            link_ours,
        )
        worker.receiver = Receiver(hand_ours, self._serve_handed)
        worker.receiver.start()
        log.debug("front-end worker %d started (pid %d)", worker.index, worker.process.pid)

    async def _supervise(self, worker: _Worker) -> None:
        backoff = _FIRST_BACKOFF
        while True:
            assert worker.process is not None
            code = await worker.process.wait()
            worker.forget()
            self.page.set(worker.index, 0)
            if self._stopping:
                return
            self.restarts += 1
            lived = time.monotonic() - worker.started
            backoff = _FIRST_BACKOFF if lived > _STABLE else min(backoff * 2, _MAX_BACKOFF)
            log.warning("front-end worker %d exited (code %s) after %.1f s: its connections are lost; restarting "
                        "it in %.1f s", worker.index, code, lived, backoff)
            while True:
                await asyncio.sleep(backoff)
                if self._stopping:
                    return
                try:
                    await self._spawn(worker)
                    break
                except OSError as exc:  # out of processes or descriptors: try again, later
                    backoff = min(backoff * 2, _MAX_BACKOFF)
                    log.error("cannot restart front-end worker %d (%s): trying again in %.1f s", worker.index,
                              exc, backoff)

    def _on_message(self, worker: _Worker, message: tuple) -> None:
        kind = message[0]
        if kind == REQUEST:
            request, loop = message[1], asyncio.get_running_loop()
            # Its body's future is there before the next message is read: that may be the body.
            coming: asyncio.Future[bytes] | None = None
            if message[3] is None:
                coming = worker.bodies[request] = loop.create_future()
            worker.requests[request] = loop.create_task(self._answer(worker, coming, *message[1:]))
        elif kind == BODY:
            body = worker.bodies.pop(message[1], None)
            if body is not None and not body.done():
                body.set_result(message[2])
        elif kind == CANCEL:
            cancelled = worker.requests.pop(message[1], None)
            if cancelled is not None:
                cancelled.cancel()

    async def _answer(self, worker: _Worker, coming: asyncio.Future[bytes] | None, request: int, fields: tuple,
                      body: bytes | None, peer: str | None, local: str | None) -> None:
        assert self._lane is not None
        try:
            head = lane_head(fields)
        except (ValueError, TypeError) as exc:
            log.error("front-end worker %d sent a malformed request (%s): closing its link", worker.index, exc)
            if worker.link is not None:
                worker.link.close()
            return

        async def whole() -> bytes:
            if coming is not None:
                return await coming
            assert body is not None
            return body

        try:
            reply, close = await self._lane.answer(head, whole, peer, local, coming is None)
        finally:
            worker.requests.pop(request, None)
            worker.bodies.pop(request, None)
        if worker.link is not None:
            worker.link.send((ANSWER, request, reply, close or self._stopping))

    def _serve_handed(self, sock: socket.socket, pending: bytes) -> None:
        """Serve a connection a worker handed over, from ``pending`` on, with aiohttp's protocol."""
        fallback = self._fallback
        assert fallback is not None
        task = asyncio.get_running_loop().create_task(_serve_from(sock, fallback(), pending))
        self._handing.add(task)
        task.add_done_callback(self._handing.discard)

    async def stop(self, deadline: float) -> None:
        """Workers stop accepting and get until ``deadline`` (``time.monotonic()``) to finish; then killed."""
        self._stopping = True
        seconds = max(deadline - time.monotonic(), 0.0)
        running = [w for w in self._workers if w.process is not None and w.process.returncode is None]
        for worker in running:
            if worker.link is not None:
                worker.link.send((STOP, seconds))
        waits = [asyncio.ensure_future(w.process.wait()) for w in running if w.process is not None]
        if waits:
            _, late = await asyncio.wait(waits, timeout=seconds + _KILL_GRACE)
            for worker in running:
                if worker.process is not None and worker.process.returncode is None:
                    log.warning("front-end worker %d had not stopped by the deadline: killed", worker.index)
                    worker.process.kill()
            if late:
                await asyncio.gather(*late, return_exceptions=True)
        for supervisor in self._supervisors:
            supervisor.cancel()
        await asyncio.gather(*self._supervisors, return_exceptions=True)
        for worker in self._workers:
            worker.forget()
        if self._listening is not None:
            self._listening.close()
            self._listening = None
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
