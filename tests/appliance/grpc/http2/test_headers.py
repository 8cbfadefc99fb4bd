"""gRPC's headers: what a call's header block says, the cache of repeated blocks, and the blocks the
server sends (read back with an independent HPACK decoder)."""

from __future__ import annotations

import base64

import hpack
import pytest

from appliance.grpc.http2.headers import HeaderDecoder, grpc_timeout, response_block, trailers_block

_CALL = [(":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
         (":authority", "box:8001"), ("content-type", "application/grpc"), ("te", "trailers"),
         ("grpc-timeout", "250m"), ("authorization", "Bearer abc"),
         ("trace-bin", base64.b64encode(b"\x00\x01").decode().rstrip("="))]


def test_a_call_s_headers_are_read_and_repeated_blocks_come_from_the_cache():
    encoder, decoder = hpack.Encoder(), HeaderDecoder(16 * 1024)
    request = decoder.decode(encoder.encode(_CALL))
    assert request.method == b"POST" and request.path == b"/inference.GRPCInferenceService/ModelInfer"
    assert request.content_type == b"application/grpc" and request.timeout == pytest.approx(0.25)
    assert request.metadata == (("authorization", "Bearer abc"), ("trace-bin", b"\x00\x01"))
    again = encoder.encode(_CALL)  # everything is in the dynamic table now: one byte a field
    assert len(again) == len(_CALL) and all(byte > 0x80 for byte in again)
    cached = decoder.decode(again)
    assert (cached.path, cached.metadata) == (request.path, request.metadata)
    assert decoder.decode(again) is cached  # answered from the cache
    changed = encoder.encode([*_CALL[:-1], ("grpc-timeout", "1S")])  # adds to the table: the cache goes
    assert decoder.decode(changed).timeout == 1.0
    assert decoder.decode(again) is not cached


def test_a_header_list_over_the_limit_and_junk_are_hpack_errors():
    with pytest.raises(hpack.HPACKError):
        HeaderDecoder(100).decode(hpack.Encoder().encode([("x", "y" * 200)]))
    with pytest.raises(hpack.HPACKError):
        HeaderDecoder(16 * 1024).decode(b"\xff\xff\xff\xff\xff\xff")


@pytest.mark.parametrize(("value", "seconds"), [(b"1H", 3600), (b"2M", 120), (b"3S", 3), (b"4m", 0.004),
                                                (b"5u", 5e-6), (b"6n", 6e-9), (b"123456789S", None),
                                                (b"S", None), (b"1x", None), (b"-1S", None)])
def test_grpc_timeout(value, seconds):
    assert grpc_timeout(value) == (pytest.approx(seconds) if seconds is not None else None)


def test_the_server_s_blocks_decode_and_messages_are_percent_encoded():
    decoder = hpack.Decoder()
    assert decoder.decode(response_block()) == [(":status", "200"), ("content-type", "application/grpc"),
                                                ("grpc-accept-encoding", "identity,deflate,gzip")]
    only = decoder.decode(trailers_block(3, "bad 100% é\n", (("retry-after", "1"),), headers_sent=False))
    assert only[:2] == [(":status", "200"), ("content-type", "application/grpc")]
    assert only[3:] == [("grpc-status", "3"), ("grpc-message", "bad 100%25 %C3%A9%0A"), ("retry-after", "1")]
    assert decoder.decode(trailers_block(0, "")) == [("grpc-status", "0")]
    assert len(trailers_block(13, "x" * 100_000)) < 9000  # a long message is cut: the block fits a frame
