"""Who may call which RPC, how many at once, and whether the server still takes calls.

The rules are REST's: control RPCs (repository load/unload, shared-memory registration, changes to the
log and trace settings) need ``authorization: Bearer <token>`` metadata unless the peer is in
``auth_exempt_networks``; with ``protect_inference`` every RPC but ServerLive/ServerReady needs it.
There is no ``trusted_proxies`` here: a gRPC peer is the client itself (nothing forwards its address).
Browser checks (Host, Origin) do not apply either: a browser cannot speak gRPC's HTTP/2 with trailers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import socket
import urllib.parse
from collections.abc import Iterator

import grpc
import psutil

from appliance.access import Network, address_in, check_bearer
from appliance.errors import Unavailable
from appliance.protocol.shared_memory import LocalPeers

__all__ = ["Access", "AccessRules", "Gate", "is_local_peer", "peer_address"]


class Access(enum.Enum):
    OPEN = "open"
    """Health: needs nothing and is outside the request bound."""
    INFERENCE = "inference"
    """Inference and metadata: the token only with protect_inference."""
    CONTROL = "control"
    """Changes the server: the token unless the peer is exempt."""


@dataclasses.dataclass(frozen=True, slots=True)
class AccessRules:
    token: str
    exempt: tuple[Network, ...]
    protect_inference: bool = False
    max_concurrent_requests: int = 1024


def peer_address(peer: str) -> str | None:
    """The IP address in a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``, ``ipv6:%5B::1%5D:5``);
    None for anything else (a UNIX socket)."""
    kind, _, rest = urllib.parse.unquote(peer).partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or None
    if kind == "ipv6" and rest.startswith("["):
        return rest[1:rest.find("]")] or None
    return None


def is_local_peer(context: grpc.aio.ServicerContext, local_peers: LocalPeers) -> bool:
    """Whether the caller runs on this host (client_shm = local): its address is in shm_local_networks, or
    is one of this host's own addresses. grpc.aio does not say which local address a call reached (REST
    compares the two); a peer with an address of this host is on this host all the same, since no other
    machine can complete a TCP handshake from it."""
    peer = peer_address(context.peer())
    if peer is None:
        return False
    own = peer if peer.split("%")[0] in _host_addresses() else None
    return local_peers.contains(peer, own)


def _host_addresses() -> set[str]:
    return {a.address.split("%")[0] for addresses in psutil.net_if_addrs().values() for a in addresses
            if a.family in (socket.AF_INET, socket.AF_INET6)}


def _authorization(context: grpc.aio.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return value if isinstance(value, str) else value.decode("latin-1")
    return None


class Gate:
    """Checks the caller of each RPC, bounds the requests in flight, and turns every new call away
    once the server is stopping (the calls already admitted finish)."""

    def __init__(self, rules: AccessRules) -> None:
        self._rules = rules
        self._running: set[asyncio.Task] = set()
        self._stopping = asyncio.Event()

    @property
    def in_flight(self) -> int:
        return len(self._running)

    def check_caller(self, context: grpc.aio.ServicerContext, access: Access) -> None:
        """Raise Unauthorized when the RPC needs the token and the call lacks it."""
        rules = self._rules
        guarded = access is Access.CONTROL or (rules.protect_inference and access is not Access.OPEN)
        if guarded and not address_in(peer_address(context.peer()), rules.exempt):
            check_bearer(_authorization(context), rules.token, "'authorization: Bearer <token>' metadata")

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

    @contextlib.contextmanager
    def admit(self, access: Access) -> Iterator[None]:
        """Held while one request runs; refuses when stopping or at max_concurrent_requests."""
        self.refuse_if_stopping()
        if access is Access.OPEN:
            yield
            return
        limit = self._rules.max_concurrent_requests
        if len(self._running) >= limit:
            raise Unavailable(f"the server is handling {limit} requests already (max_concurrent_requests); retry",
                              retry_after=1)
        task = asyncio.current_task()
        assert task is not None, "requests are admitted on the event loop"
        self._running.add(task)
        try:
            yield
        finally:
            self._running.discard(task)

    async def wait_running(self, timeout: float) -> int:
        """Wait up to ``timeout`` for the requests running now to end; how many did not end by themselves
        (still running, or cancelled meanwhile by gRPC's own stop)."""
        running = list(self._running)
        if not running:
            return 0
        done, pending = await asyncio.wait(running, timeout=timeout)
        return len(pending) + sum(1 for task in done if task.cancelled())

    async def cancel_running(self, grace: float) -> int:
        """Cancel the requests still running (at the stop deadline) and give them ``grace`` seconds to
        end; how many there were. gRPC's own stop ends their calls but not their handlers."""
        late = list(self._running)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late, timeout=grace)
        return len(late)
