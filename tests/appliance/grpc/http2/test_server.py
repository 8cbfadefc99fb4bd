"""The appliance's own HTTP/2 transport for gRPC, in process: grpcio's client against it (unary, streams,
deadlines, cancellation, compression, large messages under flow control, errors with their trailers), and
raw frames for what no well-behaved client sends (a bad preface, a broken frame, a window overrun, a
header block that never ends, too many streams or connections, TLS without ALPN h2)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import threading
from pathlib import Path

import grpc
import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import pytest

from appliance.grpc.access import Gate
from appliance.grpc.grpc_config import GrpcConfig
from appliance.grpc.http2 import connection, floods
from appliance.grpc.http2 import frames as f
from appliance.grpc.http2.server import Http2Server
from appliance.protocol.inflate import Compressed, InflateLimits, inflate
from appliance.security.budget import MemoryBudget
from appliance.tls.context import ServerTls
from tests.tls_util import Pki
from tests.waiting import await_until


class _Handlers:
    """A small service: Echo, Slow (waits until cancelled), Big (answers ``size`` bytes), Chat (echoes each
    message of a stream), Fail (aborts with trailing metadata)."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        identity = {"request_deserializer": None, "response_serializer": lambda raw: raw}
        self.table = {
            b"/t.S/Echo": grpc.stream_unary_rpc_method_handler(self.echo, **identity),
            b"/t.S/Slow": grpc.stream_unary_rpc_method_handler(self.slow, **identity),
            b"/t.S/Big": grpc.stream_unary_rpc_method_handler(self.big, **identity),
            b"/t.S/Chat": grpc.stream_stream_rpc_method_handler(self.chat, **identity),
            b"/t.S/Fail": grpc.stream_unary_rpc_method_handler(self.fail, **identity),
            b"/t.S/Hold": grpc.stream_unary_rpc_method_handler(self.hold, **identity),
        }

    async def echo(self, requests, context):
        message = await context.read()
        if isinstance(message, Compressed):  # handed over as sent: the admitting handler inflates on its budget
            message = inflate(message, message.coding, InflateLimits(1 << 30, 0), MemoryBudget(1 << 30).account())
        metadata = dict(context.invocation_metadata())
        return message + metadata.get("suffix", "").encode() + context.peer().encode()[:0]

    async def slow(self, requests, context):
        await context.read()
        try:
            await asyncio.Event().wait()  # never set: only the call's cancellation ends it
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def big(self, requests, context):
        size = int(await context.read())
        return b"x" * size

    async def chat(self, requests, context):
        async for message in requests:
            await context.write(b"re:" + message)

    async def hold(self, requests, context):
        await asyncio.Event().wait()  # never reads (until cancelled): what its client sends stays unread

    async def fail(self, requests, context):
        await context.read()
        context.set_trailing_metadata((("retry-after", "2"),))
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no: 100% wrong")


@pytest.fixture
async def server():
    handlers = _Handlers()
    config = GrpcConfig(max_message_bytes=4 << 20, max_connections=4, max_streams_per_connection=8, idle_timeout=2)
    server = Http2Server(config, Gate(None, 8), handlers.table.get)  # type: ignore[arg-type]
    await server.start("127.0.0.1", 0)
    server.handlers = handlers  # type: ignore[attr-defined]
    yield server
    await server.stop(0.5)


def _channel(server) -> grpc.Channel:
    return grpc.insecure_channel(f"127.0.0.1:{server.port}", options=[("grpc.max_receive_message_length", -1),
                                                                       ("grpc.max_send_message_length", -1)])


def _unary(server, method: str, message: bytes, **kwargs):
    with _channel(server) as channel:
        return channel.unary_unary(method)(message, **kwargs)


async def test_unary_calls_answer_with_their_message_and_metadata(server):
    assert await asyncio.to_thread(_unary, server, "/t.S/Echo", b"hello", metadata=(("suffix", "!"),)) == b"hello!"

    def many():
        with _channel(server) as channel:
            echo = channel.unary_unary("/t.S/Echo")
            futures = [echo.future(b"%d" % i) for i in range(200)]
            return [future.result() for future in futures]

    assert await asyncio.to_thread(many) == [b"%d" % i for i in range(200)]


async def test_large_messages_flow_both_ways_under_flow_control(server):
    payload = bytes(range(256)) * 12_000  # 3 MiB: far past every initial window
    assert await asyncio.to_thread(_unary, server, "/t.S/Echo", payload) == payload
    assert len(await asyncio.to_thread(_unary, server, "/t.S/Big", b"%d" % (3 << 20))) == 3 << 20


async def test_a_message_over_the_limit_is_resource_exhausted(server):
    with pytest.raises(grpc.RpcError) as error:
        await asyncio.to_thread(_unary, server, "/t.S/Echo", bytes(5 << 20))
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_request_bytes" in error.value.details()


async def test_compressed_messages_are_read(server):
    payload = b"abc" * 10_000
    def call(algorithm: grpc.Compression) -> bytes:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}", compression=algorithm) as channel:
            return channel.unary_unary("/t.S/Echo")(payload)

    for algorithm in (grpc.Compression.Gzip, grpc.Compression.Deflate):
        assert await asyncio.to_thread(call, algorithm) == payload


async def test_errors_carry_their_status_message_and_trailing_metadata(server):
    def call():
        with _channel(server) as channel:
            try:
                channel.unary_unary("/t.S/Fail").with_call(b"x")
            except grpc.RpcError as error:
                return error
            raise AssertionError("Fail answered")

    error = await asyncio.to_thread(call)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and error.details() == "no: 100% wrong"
    assert ("retry-after", "2") in error.trailing_metadata()
    with pytest.raises(grpc.RpcError) as unknown:
        await asyncio.to_thread(_unary, server, "/t.S/Nope", b"")
    assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_a_deadline_cancels_the_handler_and_answers_deadline_exceeded(server):
    with pytest.raises(grpc.RpcError) as error:
        await asyncio.to_thread(_unary, server, "/t.S/Slow", b"", timeout=0.3)
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.wait_for(server.handlers.cancelled.wait(), 5)


async def test_a_client_that_cancels_cancels_the_handler(server):
    def call():
        with _channel(server) as channel:
            future = channel.unary_unary("/t.S/Slow").future(b"")
            threading.Event().wait(0.3)
            future.cancel()

    await asyncio.to_thread(call)
    await asyncio.wait_for(server.handlers.cancelled.wait(), 5)


async def test_a_stream_answers_each_message(server):
    def call():
        with _channel(server) as channel:
            return list(channel.stream_stream("/t.S/Chat")(iter([b"a", b"b" * 100_000, b"c"])))

    assert await asyncio.to_thread(call) == [b"re:a", b"re:" + b"b" * 100_000, b"re:c"]


def _h2_blocks(port: int, table_size: int | None) -> list[list[list[tuple[str, str]]]]:
    """Calls one after another on one connection of the ``h2`` library, whose own HPACK decoder follows the
    server's dynamic table and holds it to the table size this client asks for: each call's header blocks."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    if table_size is not None:
        conn.update_settings({h2.settings.SettingCodes.HEADER_TABLE_SIZE: table_size})
    answers = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for path in ("/t.S/Echo", "/t.S/Fail", "/t.S/Nope", "/t.S/Echo", "/t.S/Echo"):
            stream = conn.get_next_available_stream_id()
            conn.send_headers(stream, [(":method", "POST"), (":scheme", "http"), (":path", path),
                                       (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")])
            conn.send_data(stream, b"\x00\x00\x00\x00\x01m", end_stream=True)
            blocks: list[list[tuple[str, str]]] = []
            ended = False
            while not ended:
                sock.sendall(conn.data_to_send())
                data = sock.recv(1 << 16)
                assert data, "the server closed the connection"
                for event in conn.receive_data(data):
                    if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                        blocks.append(list(event.headers))
                    elif isinstance(event, h2.events.StreamEnded) and event.stream_id == stream:
                        ended = True
                    assert not isinstance(event, h2.events.ConnectionTerminated), event
            answers.append(blocks)
    return answers


@pytest.mark.parametrize("table_size", [None, 0, 256])
async def test_header_blocks_are_read_by_the_h2_library_at_any_table_size(server, table_size):
    response = [(":status", "200"), ("content-type", "application/grpc"),
                ("grpc-accept-encoding", "identity,deflate,gzip")]
    ok = [response, [("grpc-status", "0")]]
    assert await asyncio.to_thread(_h2_blocks, server.port, table_size) == [
        ok,
        [[*response, ("grpc-status", "3"), ("grpc-message", "no: 100%25 wrong"), ("retry-after", "2")]],
        [[*response, ("grpc-status", "12"), ("grpc-message", "Method not found: /t.S/Nope")]],
        ok,
        ok,
    ]


# Raw frames

_ENCODER_CALL = [(":method", "POST"), (":scheme", "http"), (":path", "/t.S/Echo"), (":authority", "x"),
                 ("content-type", "application/grpc"), ("te", "trailers")]


@pytest.fixture
async def raw(server):
    """Opens raw connections to ``server``, each first sending ``preface``; closes them all at the end (a test
    that asserts the server hangs up leaves its writer to this, not to the garbage collector)."""
    writers: list[asyncio.StreamWriter] = []

    async def open_raw(preface: bytes = f.PREFACE + f.settings({})):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writers.append(writer)
        writer.write(preface)
        return reader, writer

    yield open_raw
    for writer in writers:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def _frames(reader, until_type: int | None = None, seconds: float = 3.0):
    """Frames read until one of ``until_type`` (or the connection's end)."""
    seen = []
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError, TimeoutError):
        async with asyncio.timeout(seconds):
            while True:
                head = await reader.readexactly(9)
                word, flags, stream = f.HEAD.unpack(head)
                payload = await reader.readexactly(word >> 8)
                seen.append((word & 0xFF, flags, stream, payload))
                if (word & 0xFF) == until_type:
                    break
    return seen


def _goaway_code(frames) -> int | None:
    for kind, _, _, payload in frames:
        if kind == f.GOAWAY:
            return struct.unpack(">II", payload[:8])[1]
    return None


@pytest.mark.parametrize(("send", "code"), [
    (f.frame(f.DATA, 0, 0, b"x"), f.Error.PROTOCOL_ERROR),  # DATA on stream 0
    (f.frame(f.PING, 0, 0, b"short"), f.Error.FRAME_SIZE_ERROR),
    (f.HEAD.pack(100_000 << 8 | f.DATA, 0, 1), f.Error.FRAME_SIZE_ERROR),  # a frame over the size limit
    (f.frame(f.HEADERS, f.END_HEADERS, 1, b"\xff\xff\xff\xff\xff\xff"), f.Error.COMPRESSION_ERROR),
    (f.frame(f.HEADERS, f.END_HEADERS, 2, hpack.Encoder().encode(_ENCODER_CALL)), f.Error.PROTOCOL_ERROR),
    (f.frame(f.PUSH_PROMISE, f.END_HEADERS, 1, b"\x00\x00\x00\x02"), f.Error.PROTOCOL_ERROR),
    (f.window_update(0, 0), f.Error.PROTOCOL_ERROR),
    (f.window_update(0, 2**31 - 1), f.Error.FLOW_CONTROL_ERROR),
    (f.frame(f.WINDOW_UPDATE, 0, 0, b"\x00\x00\x01"), f.Error.FRAME_SIZE_ERROR),  # read in place only at 4 bytes
    (f.frame(f.WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x01\x00"), f.Error.FRAME_SIZE_ERROR),
    (f.frame(f.HEADERS, 0, 1, hpack.Encoder().encode(_ENCODER_CALL)) + f.window_update(0, 10),  # inside a block
     f.Error.PROTOCOL_ERROR),
])
async def test_a_broken_frame_ends_the_connection_with_goaway(raw, send, code):
    reader, writer = await raw()
    writer.write(send)
    assert _goaway_code(await _frames(reader, f.GOAWAY)) == code


async def test_frames_still_coming_for_an_answered_stream_are_ignored(raw):
    reader, writer = await raw()
    encoder = hpack.Encoder()
    unknown = [*_ENCODER_CALL[:2], (":path", "/t.S/Nope"), *_ENCODER_CALL[3:]]
    writer.write(f.frame(f.HEADERS, f.END_HEADERS, 1, encoder.encode(unknown)))  # answered and reset at once
    await _frames(reader, f.RST_STREAM)
    writer.write(f.frame(f.DATA, 0, 1, b"\x00" * 100) + f.window_update(1, 10)
                 + f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, encoder.encode([("x-trailer", "1")]))
                 + f.frame(f.PING, 0, 0, b"after it"))
    frames = await _frames(reader, f.PING)
    assert _goaway_code(frames) is None and frames[-1] == (f.PING, f.ACK, 0, b"after it")


@pytest.mark.parametrize(("method", "content_type", "status"), [("POST", "application/json", "415"),
                                                                 ("GET", "application/grpc", "405")])
async def test_a_request_that_is_not_grpc_gets_an_http_status(raw, method, content_type, status):
    reader, writer = await raw()
    fields = [(":method", method), *_ENCODER_CALL[1:4], ("content-type", content_type)]
    writer.write(f.frame(f.HEADERS, f.END_HEADERS, 1, hpack.Encoder().encode(fields)))
    frames = await _frames(reader, f.RST_STREAM)
    answer = next(payload for kind, _, stream, payload in frames if kind == f.HEADERS and stream == 1)
    assert dict(hpack.Decoder().decode(answer))[":status"] == status


async def test_not_http2_and_a_silent_connection_are_closed(raw):
    reader, writer = await raw(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _goaway_code(await _frames(reader)) == f.Error.PROTOCOL_ERROR
    reader, writer = await raw(b"")  # no preface within idle_timeout (2 s)
    assert await asyncio.wait_for(reader.read(), 5) is not None and reader.at_eof()


async def test_a_header_block_that_never_ends_is_cut_off(raw):
    reader, writer = await raw()
    writer.write(f.frame(f.HEADERS, 0, 1, b""))
    for _ in range(8):
        writer.write(f.frame(f.CONTINUATION, 0, 1, b"\x00" * 16_000))
    assert _goaway_code(await _frames(reader, f.GOAWAY)) == f.Error.ENHANCE_YOUR_CALM


async def test_data_past_the_window_of_a_call_not_read_is_a_flow_control_error(raw):
    reader, writer = await raw()
    call = [*_ENCODER_CALL[:2], (":path", "/t.S/Slow"), *_ENCODER_CALL[3:]]
    writer.write(f.frame(f.HEADERS, f.END_HEADERS, 1, hpack.Encoder().encode(call)))
    for _ in range(5):  # 80 KiB on a stream whose window is 64 KiB at most
        writer.write(f.frame(f.DATA, 0, 1, b"\x00" * 16_000))
    assert _goaway_code(await _frames(reader, f.GOAWAY)) == f.Error.FLOW_CONTROL_ERROR


async def test_bytes_no_handler_reads_are_capped_per_connection(raw, monkeypatch):
    monkeypatch.setattr(connection, "UNREAD_LIMIT", 100_000)
    reader, writer = await raw()
    encoder = hpack.Encoder()
    hold = [*_ENCODER_CALL[:2], (":path", "/t.S/Hold"), *_ENCODER_CALL[3:]]
    for stream in (1, 3):
        writer.write(f.frame(f.HEADERS, f.END_HEADERS, stream, encoder.encode(hold)))
        for _ in range(4):  # 60,000 bytes each, inside the stream's window
            writer.write(f.frame(f.DATA, 0, stream, b"\x00" * 15_000))
    writer.write(f.frame(f.PING, 0, 0, b"still ok"))
    frames = await _frames(reader, f.PING)
    refused = [(stream, struct.unpack(">I", payload)[0]) for kind, _, stream, payload in frames if kind == f.RST_STREAM]
    assert refused == [(1, f.Error.REFUSED_STREAM)]  # the one holding most; the connection goes on
    assert frames[-1] == (f.PING, f.ACK, 0, b"still ok")


async def test_a_client_that_cancels_call_after_call_is_cut_off(raw, monkeypatch):
    monkeypatch.setitem(floods.FLOOD_LIMITS, floods.Flood.RESET, floods.FloodLimit(20, 1.0))
    reader, writer = await raw()
    encoder = hpack.Encoder()
    slow = [*_ENCODER_CALL[:2], (":path", "/t.S/Slow"), *_ENCODER_CALL[3:]]
    for stream in range(1, 61, 2):  # 30 calls opened and cancelled at once ("rapid reset")
        writer.write(f.frame(f.HEADERS, f.END_HEADERS, stream, encoder.encode(slow))
                     + f.rst_stream(stream, f.Error.CANCEL))
    assert _goaway_code(await _frames(reader, f.GOAWAY)) == f.Error.ENHANCE_YOUR_CALM


async def test_window_updates_are_counted_in_bunches_and_a_flood_of_them_is_cut_off(raw, monkeypatch):
    """A client's WINDOW_UPDATEs (one or two an answer) are counted against their allowance in bunches of
    WINDOW_UPDATE_BUNCH: fewer are not counted yet, the bunch that passes the allowance cuts it off."""
    monkeypatch.setitem(floods.FLOOD_LIMITS, floods.Flood.WINDOW_UPDATE, floods.FloodLimit(1, 0.001))
    reader, writer = await raw()
    update = f.frame(f.WINDOW_UPDATE, 0, 0, struct.pack(">I", 1))
    writer.write(update * (floods.WINDOW_UPDATE_BUNCH - 1) + f.frame(f.PING, 0, 0, b"not yet!"))
    frames = await _frames(reader, f.PING)
    assert frames[-1] == (f.PING, f.ACK, 0, b"not yet!") and _goaway_code(frames) is None
    writer.write(update + f.frame(f.PING, 0, 0, b"now cut!"))
    assert _goaway_code(await _frames(reader, f.GOAWAY)) == f.Error.ENHANCE_YOUR_CALM


async def test_streams_over_the_limit_are_refused_and_pings_answered(raw):
    reader, writer = await raw()
    encoder = hpack.Encoder()
    slow = [*_ENCODER_CALL[:2], (":path", "/t.S/Slow"), *_ENCODER_CALL[3:]]
    for stream in range(1, 20, 2):  # ten calls; the limit is eight
        writer.write(f.frame(f.HEADERS, f.END_HEADERS, stream, encoder.encode(slow)))
    writer.write(f.frame(f.PING, 0, 0, b"12345678"))
    frames = await _frames(reader, f.PING)
    refused = [stream for kind, _, stream, payload in frames
               if kind == f.RST_STREAM and struct.unpack(">I", payload)[0] == f.Error.REFUSED_STREAM]
    assert refused == [17, 19]
    assert frames[-1] == (f.PING, f.ACK, 0, b"12345678")


async def test_connections_over_the_limit_are_closed_at_once(server):
    held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]
    try:
        await await_until(lambda: len(server._connections) == 4, timeout=10, what="the four connections taken")
        extra = socket.create_connection(("127.0.0.1", server.port))
        extra.settimeout(3)

        def closed() -> bool:
            try:
                return extra.recv(100) == b""
            except ConnectionResetError:
                return True

        assert await asyncio.to_thread(closed)  # no SETTINGS: closed before a byte
        extra.close()
    finally:
        for sock in held:
            sock.close()


async def test_stopping_sends_goaway_and_new_calls_wait_no_longer(server, raw):
    reader, writer = await raw()
    await _frames(reader, f.SETTINGS, 1)
    await server.stop(0.2)
    assert _goaway_code(await _frames(reader, f.GOAWAY)) == f.Error.NO_ERROR


@pytest.fixture
async def tls_server(tmp_path: Path):
    pki = Pki(tmp_path / "pki")
    handlers = _Handlers()
    config = GrpcConfig(max_message_bytes=1 << 20, max_connections=4, idle_timeout=5, tls=ServerTls(pki.cert, pki.key))
    server = Http2Server(config, Gate(None, 8), handlers.table.get)  # type: ignore[arg-type]
    await server.start("127.0.0.1", 0)
    server.pki = pki  # type: ignore[attr-defined]
    yield server
    await server.stop(0.5)


@pytest.mark.parametrize("alpn", [["h2"], ["http/1.1"], None], ids=["h2", "http1.1", "none"])
async def test_over_tls_http2_is_spoken_only_where_alpn_selected_h2(tls_server, alpn):
    context = tls_server.pki.context()
    if alpn is not None:
        context.set_alpn_protocols(alpn)
    reader, writer = await asyncio.open_connection("127.0.0.1", tls_server.port, ssl=context)
    served = alpn == ["h2"]
    assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == ("h2" if served else None)
    writer.write(f.PREFACE + f.settings({}))
    frames = await _frames(reader, f.SETTINGS, 5)
    assert [kind for kind, *_ in frames] == ([f.SETTINGS] if served else [])  # else closed, no frame
    if not served:
        assert reader.at_eof()
        await await_until(lambda: not tls_server._limiter.open, timeout=5, what="the refused connection's slot back")
    writer.close()
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        await writer.wait_closed()


async def test_grpcio_over_tls_offers_h2_and_is_served(tls_server):
    credentials = grpc.ssl_channel_credentials(root_certificates=tls_server.pki.ca_file.read_bytes())

    def call() -> bytes:
        with grpc.secure_channel(f"127.0.0.1:{tls_server.port}", credentials) as channel:
            return channel.unary_unary("/t.S/Echo")(b"over tls", timeout=10)

    assert await asyncio.to_thread(call) == b"over tls"
