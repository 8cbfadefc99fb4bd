"""When the own HTTP/2 transport sends what its calls write: the sends of one loop turn go out together,
and the answer of a connection's last open call goes out in the turn the call ends."""

from __future__ import annotations

import asyncio

import hpack

from appliance.grpc.http2 import frames as f
from appliance.grpc.http2.connection import Http2Connection
from tests.appliance.grpc.http2.hosts import EchoHost, RecordingTransport
from tests.waiting import next_turn

_GOOD = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/t.S/Echo"), (b":authority", b"x"),
         (b"content-type", b"application/grpc"), (b"te", b"trailers")]


def _call(encoder: hpack.Encoder, stream: int, payload: bytes) -> bytes:
    return (f.frame(f.HEADERS, f.END_HEADERS, stream, encoder.encode(_GOOD))
            + f.frame(f.DATA, f.END_STREAM, stream, b"\x00" + len(payload).to_bytes(4, "big") + payload))


async def _connected() -> tuple[Http2Connection, RecordingTransport]:
    connection = Http2Connection(EchoHost(asyncio.get_running_loop()))
    transport = RecordingTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    connection.data_received(f.PREFACE + f.settings({}))
    await next_turn()
    transport.sends.clear()
    return connection, transport


async def test_the_last_open_call_is_answered_in_the_turn_it_ends():
    connection, transport = await _connected()
    connection.data_received(_call(hpack.Encoder(), 1, b"one"))
    task = connection._calls[1]._task
    assert task is not None
    for _ in range(10):
        await next_turn()
        if task.done():
            break
    assert task.done()
    assert len(transport.sends) == 1 and b"one" in transport.sends[0]  # sent already, not a turn later
    connection.connection_lost(None)


async def test_calls_that_end_in_one_turn_are_answered_in_one_send():
    connection, transport = await _connected()
    encoder = hpack.Encoder()
    connection.data_received(_call(encoder, 1, b"one") + _call(encoder, 3, b"two"))
    await next_turn(10)
    assert not connection._calls
    assert len(transport.sends) == 1 and b"one" in transport.sends[0] and b"two" in transport.sends[0]
    connection.connection_lost(None)
