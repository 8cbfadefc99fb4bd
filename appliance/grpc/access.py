"""Who a gRPC caller is, and the gate every call passes: the data plane's admission (the token from the
``authorization`` metadata, the bound on requests in flight, which every call counts in, health checks
too), a bound on open streams, and the stop.

There is no ``trusted_proxies`` here: a gRPC peer is the client itself (nothing forwards its address).
Browser rules do not apply either: a browser cannot speak gRPC's HTTP/2 with trailers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import urllib.parse
from collections.abc import Iterator

import grpc

from appliance.core.errors import Unavailable
from appliance.protocol.admission import Admitted, Caller
from appliance.protocol.dataplane import DataPlane
from appliance.protocol.operations import Operation

__all__ = ["Gate", "GateAdmitted", "caller_of", "peer_address"]

_CREDENTIALS = "'authorization: Bearer <token>' metadata"


@functools.lru_cache(maxsize=4096)
def peer_address(peer: str) -> str | None:
    """The IP address in a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``, ``ipv6:%5B::1%5D:5``);
    None for anything else (a UNIX socket)."""
    kind, _, rest = urllib.parse.unquote(peer).partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or None
    if kind == "ipv6" and rest.startswith("["):
        return rest[1:rest.find("]")] or None
    return None


def caller_of(context: grpc.aio.ServicerContext) -> Caller:
    """The call's client for the data plane: its address, and its ``authorization`` metadata."""
    authorization = None
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            authorization = value if isinstance(value, str) else value.decode("latin-1")
            break
    return Caller(peer_address(context.peer()), authorization, credentials=_CREDENTIALS, always_counted=True)


class Gate:
    """Admits each call through the data plane before a byte of its message is read, bounds the open
    ModelStreamInfer streams, and turns every new call (and new request on an open stream) away once the
    server is stopping; the calls already admitted finish, and at the deadline are cancelled."""

    def __init__(self, dataplane: DataPlane, max_streams: int = 1024) -> None:
        self._dataplane = dataplane
        self.max_streams = max_streams
        self._streams = 0
        self._running: set[asyncio.Task] = set()
        self._stopping = asyncio.Event()

    @property
    def in_flight(self) -> int:
        return len(self._running)

    @property
    def streams(self) -> int:
        return self._streams

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self) -> None:
        """From now on every new call, and every new request on an open stream, is turned away."""
        self._stopping.set()

    async def wait_stopping(self) -> None:
        await self._stopping.wait()

    def refuse_if_stopping(self) -> None:
        if self.stopping:
            raise Unavailable("the server is stopping and takes no new requests; retry on another box or once it "
                              "has restarted", retry_after=1)

    def admit(self, operation: Operation, caller: Caller) -> GateAdmitted:
        """Held while one call (or one request of a stream) runs."""
        return GateAdmitted(self, operation, caller)

    @contextlib.contextmanager
    def open_stream(self, caller: Caller) -> Iterator[None]:
        """Held while a ModelStreamInfer stream is open: it counts in max_concurrent_requests (as one
        request) and among the grpc max_streams."""
        if self._streams >= self.max_streams:
            raise Unavailable(f"the server has {self.max_streams} ModelStreamInfer streams open already (the grpc "
                              "max_streams setting); retry, or send more requests on an open stream", retry_after=1)
        with self.admit(Operation.INFER_STREAM, caller):
            self._streams += 1
            try:
                yield
            finally:
                self._streams -= 1

    @property
    def running(self) -> tuple[asyncio.Task, ...]:
        """The tasks of the requests running now (what the server's stop waits for, then cancels)."""
        return tuple(self._running)


class GateAdmitted:
    """``Gate.admit``: refused when the server is stopping, then admitted by the data plane, and the call's
    task counted as running (the stop waits for it). A class rather than a generator: every call enters
    one."""

    __slots__ = ("_gate", "_operation", "_caller", "_admitted", "_task")

    def __init__(self, gate: Gate, operation: Operation, caller: Caller) -> None:
        self._gate = gate
        self._operation = operation
        self._caller = caller
        self._admitted: Admitted | None = None
        self._task: asyncio.Task | None = None

    def __enter__(self) -> None:
        gate = self._gate
        gate.refuse_if_stopping()
        task = asyncio.current_task()
        assert task is not None, "requests are admitted on the event loop"
        admitted = gate._dataplane.admit(self._operation, self._caller)
        admitted.__enter__()
        self._admitted, self._task = admitted, task
        gate._running.add(task)

    def __exit__(self, *exc_info: object) -> None:
        assert self._admitted is not None and self._task is not None
        self._gate._running.discard(self._task)
        self._admitted.__exit__(None, None, None)
