"""Receiving a call's message, once the call is admitted: receive slots and a minimum rate.

A receive slot bounds what the transport holds before the handler can count it: at most ``count``
messages larger than a stream's window are received at once, and ``count`` times the largest message
(``max_request_bytes``) fits in ``max_request_memory_bytes``. What keeps a slot from being held by a client
that announces a message and sends nothing (while every other call waits for a slot):

- The transport (``Metered``: ``appliance.grpc.http2.call.Call``) sees each message's 5-byte prefix and
  its bytes as they come. A message that fits the window the stream has anyway takes no slot; a larger
  one takes a slot only once its prefix says so; and every message must keep coming at
  ``ReceiveRules.min_rate`` after ``ReceiveRules.grace`` (the meter), or the call fails
  (DEADLINE_EXCEEDED) and its slot goes to the next call.
- A freed slot goes to a waiting call of the connection that holds the fewest (then: that has the fewest
  waiting; then: in order of arrival): the calls one connection parks never queue ahead of another's.
  One connection holds or waits for at most ``per_connection`` slots; past them its calls are refused at
  once (UNAVAILABLE): they could not be received sooner, and would hold max_concurrent_requests
  meanwhile.

Free slots are taken without a trip through the event loop; a call that finds none waits, up to the
receive timeout (UNAVAILABLE).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Any, Protocol

import grpc

from appliance.core.errors import InvalidInput, Unavailable
from appliance.grpc.grpc_config import ReceiveRules

__all__ = ["Metered", "Receivers"]

PER_CONNECTION = 64
"""Slots one connection may hold or wait for, at least (4 times the slots where that is more)."""


class Metered(Protocol):
    """What a transport that sees a message's bytes as they come offers (``appliance.grpc.http2.call.Call``)."""

    async def announced(self, rules: ReceiveRules) -> bool: ...

    def meter(self, rules: ReceiveRules) -> None: ...

    async def read(self) -> Any: ...


class Receivers:
    """``count`` receive slots, shared by every connection of one server (see the module's docstring).
    ``rules``: the receive timeout, minimum rate and grace (``timeout`` alone where none are given)."""

    def __init__(self, count: int, timeout: float = 60.0, *, rules: ReceiveRules | None = None,
                 per_connection: int | None = None) -> None:
        if count < 1:
            raise ValueError(f"at least one receiver is needed, got {count}")
        self.count = count
        self.rules = rules if rules is not None else ReceiveRules(timeout=timeout)
        self.per_connection = per_connection if per_connection is not None else max(PER_CONNECTION, 4 * count)
        self._free = count
        self._waiting: list[tuple[str, asyncio.Future[None]]] = []
        self._peers: collections.Counter[str] = collections.Counter()
        """Slots each connection holds or waits for."""
        self._holding: collections.Counter[str] = collections.Counter()
        """Slots each connection holds (or was just handed)."""

    async def receive(self, call: Metered, peer: str = "") -> bytes:
        """The call's one message: a slot only when it needs the stream's window opened, every byte under
        the meter."""
        rules = self.rules
        if await call.announced(rules):
            await self._acquire(peer)
            try:
                call.meter(rules)  # from its turn: until then the client could not send
                message = await call.read()
            finally:
                self._release(peer)
        else:
            message = await call.read()
        if message is grpc.aio.EOF:
            raise InvalidInput("the call ended without its request message")
        return message

    async def _acquire(self, peer: str) -> None:
        if self._peers[peer] >= self.per_connection:
            raise Unavailable(f"this connection has {self.per_connection} messages being received, or waiting "
                              "to be, already; retry once they are in, or send large messages on more "
                              "connections", retry_after=1)
        self._peers[peer] += 1
        if self._free > 0 and not self._waiting:
            self._free -= 1
            self._holding[peer] += 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (peer, turn)
        self._waiting.append(entry)
        try:
            await asyncio.wait((turn,), timeout=self.rules.timeout)
            if not turn.done():
                raise Unavailable(f"the server is receiving {self.count} large messages already and none "
                                  f"ended within {self.rules.timeout:g} s; retry", retry_after=1)
        except BaseException:
            if turn.done() and not turn.cancelled():  # handed over just as this call gave up: to the next one
                self._unhold(peer)
                self._pass_on()
            self._forget(peer)
            raise
        finally:
            if not turn.done():
                turn.cancel()
            with contextlib.suppress(ValueError):
                self._waiting.remove(entry)

    def _release(self, peer: str) -> None:
        self._unhold(peer)
        self._forget(peer)
        self._pass_on()

    def _unhold(self, peer: str) -> None:
        self._holding[peer] -= 1
        if not self._holding[peer]:
            del self._holding[peer]

    def _forget(self, peer: str) -> None:
        self._peers[peer] -= 1
        if not self._peers[peer]:
            del self._peers[peer]

    def _pass_on(self) -> None:
        """A slot came free: to the waiting call of the connection holding fewest (of those, the one with
        the fewest waiting; then the first to come), else back to the pool."""
        chosen: tuple[str, asyncio.Future[None]] | None = None
        best = (0, 0)
        for entry in self._waiting:
            if entry[1].done():
                continue
            rank = (self._holding[entry[0]], self._peers[entry[0]])
            if chosen is None or rank < best:
                chosen, best = entry, rank
        if chosen is None:
            self._free += 1
            return
        self._waiting.remove(chosen)
        self._holding[chosen[0]] += 1
        chosen[1].set_result(None)

