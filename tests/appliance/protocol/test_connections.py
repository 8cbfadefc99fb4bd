"""The connection cap every port applies (the HTTP ports' 503 refusal is tested in rest/test_http_server.py):
counted until closed, refused beyond the cap without reaching the server, slots given back."""

from __future__ import annotations

import asyncio
import gc

import pytest

from appliance.protocol.connections import ConnectionLimiter
from tests.waiting import await_until


class _Echo(asyncio.Protocol):
    made = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _Echo.made += 1
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._transport.write(data)  # type: ignore[attr-defined]


async def test_a_connection_beyond_the_cap_is_closed_before_the_server_sees_it():
    limiter = ConnectionLimiter(2)
    _Echo.made = 0
    server = await asyncio.get_running_loop().create_server(limiter.wrap(_Echo), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        for reader, writer in held:
            writer.write(b"ping")
            assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"ping")
        with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(reader.readexactly(4), 5)  # aborted: no answer, no server
        writer.close()
        assert (limiter.open, limiter.refused, _Echo.made) == (2, 1, 2)
        for _, each in held:
            each.close()
        await await_until(lambda: limiter.open == 0, timeout=10, what="both slots given back")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"again")
        assert await asyncio.wait_for(reader.readexactly(5), 5) == b"again"
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


def test_a_protocol_never_connected_gives_its_slot_back_when_it_goes_away():
    limiter = ConnectionLimiter(1)
    made = limiter.wrap(asyncio.Protocol)()  # asyncio could not make a transport for the socket
    assert limiter.open == 1
    del made
    gc.collect()
    assert limiter.open == 0


def test_the_refusal_is_the_ports_own():
    refusals: list[asyncio.Protocol] = []

    def refuse() -> asyncio.Protocol:
        refusals.append(asyncio.Protocol())
        return refusals[-1]

    limiter = ConnectionLimiter(1, refuse)
    first = limiter.wrap(asyncio.Protocol)()
    assert limiter.wrap(asyncio.Protocol)() is refusals[0]
    assert len(refusals) == 1 and limiter.refused == 1 and limiter.open == 1
    first.connection_lost(None)
    assert limiter.open == 0


def test_a_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        ConnectionLimiter(0)

