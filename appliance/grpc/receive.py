"""Receiving a call's message, once the call is admitted: receive slots, a minimum rate, compressed messages.

A receive slot bounds what the transport holds before the handler can count it: at most ``count``
messages larger than a stream's window are received at once, and ``count`` times the largest message
(``max_request_bytes``) fits in ``max_request_memory_bytes``. What keeps a slot from being held by a client
that announces a message and sends nothing (while every other call waits for a slot):

- The appliance's transport (``Metered``: ``appliance.grpc.http2.call.Call``) sees each message's 5-byte
  prefix and its bytes as they come. A message that fits the window the stream has anyway takes no slot;
  a larger one takes a slot only once its prefix says so; and every message must keep coming at
  ``ReceiveRules.min_rate`` after ``ReceiveRules.grace`` (the meter), or the call fails
  (DEADLINE_EXCEEDED) and its slot goes to the next call.
- grpc.aio shows nothing of a message before it is whole, so every read takes a slot, and a call that has
  held one longer than the grace gives it up (UNAVAILABLE) to a call that waits for one.
- A freed slot goes to a waiting call of the connection that holds the fewest (then: that has the fewest
  waiting; then: in order of arrival): the calls one connection parks never queue ahead of another's.
  One connection holds or waits for at most ``per_connection`` slots; past them its calls are refused at
  once (UNAVAILABLE): they could not be received sooner, and would hold max_concurrent_requests
  meanwhile.

Free slots are taken without a trip through the event loop; a call that finds none waits, up to the
receive timeout (UNAVAILABLE). grpc.aio also hands compressed messages over as sent (the server turns
its own inflating off: it inflated before any handler could count), without their flag: ``sniffed`` tells
them by their first bytes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import grpc

from appliance.core.errors import InvalidInput, RequestTimeout, Unavailable
from appliance.grpc.grpc_config import ReceiveRules
from appliance.protocol.inflate import Compressed

__all__ = ["DRAIN_BYTES", "Metered", "Receivers", "sniffed", "sniffing"]

DRAIN_BYTES = 64 * 1024
PER_CONNECTION = 64
"""Slots one connection may hold or wait for, at least (4 times the slots where that is more)."""


class Metered(Protocol):
    """What a transport that sees a message's bytes as they come offers (the appliance's own)."""

    async def announced(self, rules: ReceiveRules) -> bool: ...

    def meter(self, rules: ReceiveRules) -> None: ...

    async def read(self) -> Any: ...


@dataclasses.dataclass(eq=False, slots=True)
class _Holder:
    peer: str
    task: asyncio.Task | None
    """The reading task, when it may be made to give its slot up (grpc.aio)."""
    since: float
    preempted: bool = False


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
        self._holders: dict[_Holder, None] = {}
        """In the order they took their slot."""
        self._peers: collections.Counter[str] = collections.Counter()
        """Slots each connection holds or waits for."""
        self._holding: collections.Counter[str] = collections.Counter()
        """Slots each connection holds (or was just handed)."""

    async def receive(self, read: Callable[[], Awaitable[Any]], peer: str = "") -> bytes:
        """The call's one message on grpc.aio (``read``: its ``context.read``), in a slot, within the receive
        timeout; and for a large one the end of its requests too: grpc.aio keeps a message it handed over
        alive, after the call, until the end of the requests is read or the garbage collector finds the call
        (24 calls of 16 MiB: 388 MiB kept); for a small message that extra read would cost more than the
        bytes it frees."""
        timeout = self.rules.timeout
        holder = await self._acquire(peer, asyncio.current_task())
        try:
            async with asyncio.timeout(timeout):
                message = await read()
                if message is grpc.aio.EOF:
                    raise InvalidInput("the call ended without its request message")
                if len(message) >= DRAIN_BYTES and await read() is not grpc.aio.EOF:
                    raise InvalidInput("a unary RPC got a second request message; send one per call")
        except TimeoutError:
            raise RequestTimeout(f"the request message did not arrive within {timeout:g} s; send it without "
                                 "pauses (the server's body_timeout setting)") from None
        except asyncio.CancelledError:
            if not holder.preempted:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            raise Unavailable(f"this call's message had not arrived {self.rules.grace:g} s after its turn came "
                              "(the grpc_receive_grace setting) and another call needed the receive slot; send "
                              "it without pauses, and retry", retry_after=1) from None
        finally:
            self._release(holder)
        return message

    async def receive_metered(self, call: Metered, peer: str = "") -> bytes:
        """The call's one message on the appliance's transport: a slot only when it needs the stream's
        window opened, every byte under the meter."""
        rules = self.rules
        if await call.announced(rules):
            holder = await self._acquire(peer, None)
            try:
                call.meter(rules)  # from its turn: until then the client could not send
                message = await call.read()
            finally:
                self._release(holder)
        else:
            message = await call.read()
        if message is grpc.aio.EOF:
            raise InvalidInput("the call ended without its request message")
        return message

    async def _acquire(self, peer: str, task: asyncio.Task | None) -> _Holder:
        if self._peers[peer] >= self.per_connection:
            raise Unavailable(f"this connection has {self.per_connection} messages being received, or waiting "
                              "to be, already; retry once they are in, or send large messages on more "
                              "connections", retry_after=1)
        self._peers[peer] += 1
        loop = asyncio.get_running_loop()
        holder = _Holder(peer, task, loop.time())
        if self._free > 0 and not self._waiting:
            self._free -= 1
            self._holding[peer] += 1
            self._holders[holder] = None
            return holder
        turn: asyncio.Future[None] = loop.create_future()
        entry = (peer, turn)
        self._waiting.append(entry)
        deadline = loop.time() + self.rules.timeout
        try:
            while not turn.done():
                now = loop.time()
                if now >= deadline:
                    raise Unavailable(f"the server is receiving {self.count} large messages already and none "
                                      f"ended within {self.rules.timeout:g} s; retry", retry_after=1)
                # Looked at again at least every grace: slots handed on meanwhile have new holders.
                wake = min(deadline, self._preempt(now), now + self.rules.grace)
                await asyncio.wait((turn,), timeout=wake - now)
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
        holder.since = loop.time()
        self._holders[holder] = None
        return holder

    def _preempt(self, now: float) -> float:
        """Make the holder that has had its slot longest past the grace give it up, unless as many are giving
        theirs up already as calls wait (only grpc.aio's reads: the appliance's own are metered); when the
        next holder comes past the grace."""
        grace = self.rules.grace
        giving_up = 0
        oldest: _Holder | None = None
        later = float("inf")
        for holder in self._holders:
            if holder.task is None:
                continue
            if holder.preempted:
                giving_up += 1
            elif holder.since + grace > now:
                later = min(later, holder.since + grace)
            elif oldest is None:
                oldest = holder
        if oldest is not None and oldest.task is not None and giving_up < len(self._waiting):
            oldest.preempted = True
            oldest.task.cancel()  # its receive answers UNAVAILABLE and hands the slot on
        return later

    def _release(self, holder: _Holder) -> None:
        del self._holders[holder]
        self._unhold(holder.peer)
        self._forget(holder.peer)
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


def sniffed(message: bytes) -> bytes:
    """A message grpc.aio handed over, as ``Compressed`` when it is: a gzip member starts with 1f 8b, which
    no protobuf message can (field 3 of wire type 7, which does not exist); a zlib stream with a header
    that only a message opening with a varint in an odd field up to 15 could have, and none of Triton's
    requests does."""
    if len(message) < 2:
        return message
    first, second = message[0], message[1]
    if first == 0x1F and second == 0x8B:
        return Compressed(message, "gzip")
    if first & 0x0F == 8 and first >> 4 <= 7 and not second & 0x20 and (first << 8 | second) % 31 == 0:
        return Compressed(message, "deflate")
    return message


async def sniffing(requests: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A stream's messages from grpc.aio, compressed ones as ``Compressed``."""
    async for message in requests:
        yield sniffed(message)
