"""A front-end worker process: accepts connections on the HTTP port (a listening socket it shares with
the other workers), reads requests with the infer lane's connections, and sends each lane request (its
head's fields and its body, once complete) to the daemon over its link; writes the daemon's answer.
Everything that decides an answer (Host, token, admission, the model, the codec) runs in the daemon, on
the same ``InferLane.answer`` as the daemon's own connections; what the worker does is the HTTP/1.1
framing around it (heads, bodies, keep-alive, pipelining, timeouts), the part of a request's CPU that
needs no model. A connection's first request that is not the lane's is handed, socket and bytes, to the
daemon's aiohttp (``appliance.workers.handoff``).

Started by ``appliance.workers.pool`` as ``python -m appliance.workers.worker SPEC`` (SPEC: JSON of the
inherited descriptors and the limits); it ends when the daemon tells it to stop, or when its link to the
daemon is gone."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable

from appliance.core.errors import ApplianceError
from appliance.protocol.connections import ConnectionPage
from appliance.rest.lane_connection import LaneConnections
from appliance.rest.lane_wire import LaneHead, error_answer, error_response
from appliance.rest.refusal import http_connection_limiter
from appliance.runtime.event_loop import run
from appliance.workers.handoff import HandOff, HandOver
from appliance.workers.link import Link
from appliance.workers.messages import ANSWER, BODY, CANCEL, READY, REQUEST, STOP, head_fields

__all__ = ["RemoteLane", "Worker", "main"]

class RemoteLane(LaneConnections):
    """The lane of a worker's connections: each request is answered by the daemon over ``link``."""

    def __init__(self, header_timeout: float, body_timeout: float, max_body: int) -> None:
        super().__init__(header_timeout, body_timeout, max_body)
        self._ids = itertools.count()
        self._waiting: dict[int, asyncio.Future[tuple[list[bytes], bool]]] = {}
        self.link: Link | None = None

    def answered(self, request: int, reply: list[bytes], close: bool) -> None:
        waiting = self._waiting.pop(request, None)
        if waiting is not None and not waiting.done():
            waiting.set_result((reply, close))

    def link_lost(self) -> None:
        """The daemon is gone: every request waiting on it is answered 503, and the connections close."""
        self.stopping = True
        self.link = None
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_result((_RESTARTING, True))
        self._waiting.clear()

    async def answer(self, head: LaneHead, body: Callable[[], Awaitable[bytes]], peer: str | None,
                     local: str | None, complete: bool = False) -> tuple[list[bytes], bool]:
        """The head goes to the daemon at once (with the body when it is in): the daemon admits or refuses
        the request while its body comes, as it does for its own connections."""
        link = self.link
        if link is None:
            return _RESTARTING, True
        request = next(self._ids)
        waiting = self._waiting[request] = asyncio.get_running_loop().create_future()
        link.send((REQUEST, request, head_fields(head), await body() if complete else None, peer, local))
        collect: asyncio.Future[bytes] | None = None
        try:
            if not complete:
                collect = asyncio.ensure_future(body())
                await asyncio.wait((collect, waiting), return_when=asyncio.FIRST_COMPLETED)
                if not waiting.done():
                    try:
                        data = collect.result()
                    except ApplianceError as exc:  # a piece of the body came too late
                        self._give_up(request)
                        return error_answer(exc)
                    link.send((BODY, request, data))
            return await waiting
        except asyncio.CancelledError:  # the client went away: its request leaves its model's queue
            self._give_up(request)
            raise
        finally:
            if collect is not None and not collect.done():
                collect.cancel()  # answered before its body was in: the connection drops the rest

    def _give_up(self, request: int) -> None:
        if self._waiting.pop(request, None) is not None and self.link is not None:
            self.link.send((CANCEL, request))


_RESTARTING = error_response(503, "the server's front end is restarting; retry")


class Worker:
    """One worker's lifetime: ``serve`` accepts until the daemon says stop (or is gone), then drains."""

    def __init__(self, spec: dict) -> None:
        self._spec = spec
        self.lane = RemoteLane(spec["header_timeout"], spec["body_timeout"], spec["max_body"])
        self._server: asyncio.Server | None = None
        self._stopping: asyncio.Task | None = None

    def _on_message(self, message: tuple) -> None:
        kind = message[0]
        if kind == ANSWER:
            self.lane.answered(message[1], message[2], message[3])
        elif kind == STOP and self._stopping is None:
            self._stopping = asyncio.get_running_loop().create_task(self._stop(message[1]))

    async def _stop(self, seconds: float) -> None:
        """Stop accepting; requests in progress get ``seconds`` (the daemon answers them meanwhile)."""
        if self._server is not None:
            self._server.close()
        await self.lane.stop(time.monotonic() + seconds)
        if self.lane.link is not None:
            self.lane.link.close()

    async def serve(self) -> None:
        spec, loop = self._spec, asyncio.get_running_loop()
        _, link = await loop.connect_accepted_socket(lambda: Link(self._on_message),
                                                     socket.socket(fileno=spec["link"]))
        self.lane.link = link
        over = HandOver(socket.socket(fileno=spec["handoff"]))
        page = ConnectionPage(spec["page"], spec["processes"])
        limiter = http_connection_limiter(spec["limit"], (page, spec["index"]))
        factory = limiter.wrap(self.lane.protocol(lambda: HandOff(over)))
        self._server = await loop.create_server(factory, sock=socket.socket(fileno=spec["listen"]))
        link.send((READY,))
        try:
            await link.closed
        finally:
            self._server.close()
            if self._stopping is not None:
                await self._stopping
            self.lane.link_lost()
            await self.lane.stop(time.monotonic())
            over.close()


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    logging.basicConfig(level=spec.get("log_level", logging.INFO),
                        format=f"%(asctime)s worker {spec['index']} %(levelname)s %(name)s: %(message)s")
    os.environ.pop("NOTIFY_SOCKET", None)
    # A terminal's Ctrl-C reaches the whole group: the daemon stops its workers itself (STOP, or its end).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    run(Worker(spec).serve(), spec.get("event_loop", "auto"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
