"""gRPC's headers: what a call's header block says, the cache of repeated blocks, and the blocks the
server sends (read back, block after block, with an independent HPACK decoder)."""

from __future__ import annotations

import base64

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.grpc.http2.headers import ENCODER_TABLE_SIZE, HeaderDecoder, HeaderEncoder, Request, grpc_timeout

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


def test_a_block_with_literals_not_indexed_is_cached_until_the_table_changes():
    """Literals sent without indexing (h2load's and nghttp2's way with some headers) change no table: the
    block decodes the same way until one that adds to the table, or resizes it, comes."""
    encoder, decoder = hpack.Encoder(), HeaderDecoder(16 * 1024)
    decoder.decode(encoder.encode(_CALL))
    literal = [*_CALL, hpack.NeverIndexedHeaderTuple("content-length", "42")]
    block = encoder.encode(literal)
    first = decoder.decode(block)
    assert first.content_length == 42 and decoder.decode(block) is first  # changed no table: cached
    added = encoder.encode([*_CALL, ("x-added", "1")])
    assert decoder.decode(added).metadata[-1] == ("x-added", "1")
    again = decoder.decode(block)
    assert again is not first and again.content_length == 42  # decoded afresh after the table changed
    assert decoder.decode(block) is again
    encoder.header_table_size = 64  # the next block starts with a size update (evicting entries)
    resized = encoder.encode(literal)
    assert decoder.decode(resized).path == first.path
    with pytest.raises(hpack.HPACKError):  # decoded afresh, not from the cache: its indexes are gone
        decoder.decode(block)


_FIELDS = st.sampled_from([(":path", "/a"), (":path", "/b"), ("x-key", "v1"), ("x-key", "v2"),
                           ("authorization", "Bearer t"), ("content-length", "7"), ("x-long", "z" * 40)])


@settings(max_examples=150, deadline=None)
@given(calls=st.lists(st.tuples(st.lists(st.tuples(_FIELDS, st.booleans()), max_size=6),
                                st.sampled_from([None, 0, 64, 256, 4096])), min_size=1, max_size=12))
def test_the_cache_never_changes_what_a_block_decodes_to(calls):
    """Whatever mix of indexed fields, literals (indexed or not) and table size updates a client sends,
    the cached decoder reads each block as an independent HPACK decoder reads it."""
    encoder, decoder, reference = hpack.Encoder(), HeaderDecoder(16 * 1024), hpack.Decoder()
    for fields, table_size in calls:
        if table_size is not None:
            encoder.header_table_size = table_size
        listed = [(":method", "POST"), *[hpack.NeverIndexedHeaderTuple(*field) if never else field
                                         for field, never in fields]]
        for _ in range(2):  # each block twice: the second may come from the cache
            block = encoder.encode(listed)
            expected = Request(reference.decode(block, raw=True))
            got = decoder.decode(block)
            assert (got.path, got.metadata, got.content_length, got.malformed) == (
                expected.path, expected.metadata, expected.content_length, expected.malformed)


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


_RESPONSE = [(":status", "200"), ("content-type", "application/grpc"),
             ("grpc-accept-encoding", "identity,deflate,gzip")]


def test_the_server_s_blocks_decode_and_messages_are_percent_encoded():
    encoder, decoder = HeaderEncoder(), hpack.Decoder()
    assert decoder.decode(encoder.response()) == _RESPONSE
    only = decoder.decode(encoder.trailers(3, "bad 100% é\n", (("retry-after", "1"),), headers_sent=False))
    assert only[:3] == _RESPONSE
    assert only[3:] == [("grpc-status", "3"), ("grpc-message", "bad 100%25 %C3%A9%0A"), ("retry-after", "1")]
    assert decoder.decode(encoder.trailers(0, "")) == [("grpc-status", "0")]
    assert decoder.decode(encoder.response(415))[0] == (":status", "415")
    long = encoder.trailers(13, "\\" * 100_000)  # a long message is cut, and not Huffman coded (where \ grows)
    assert len(long) < 9000 and decoder.decode(long)[1] == ("grpc-message", "\\" * 8192)


def test_a_call_s_usual_blocks_are_indexed_and_cached_until_the_table_changes():
    encoder, decoder = HeaderEncoder(), hpack.Decoder()
    for block in (encoder.response(), encoder.trailers(0, "")):
        decoder.decode(block)
    head, tail = encoder.response(), encoder.trailers(0, "")
    assert (len(head), len(tail)) == (3, 1)  # one indexed byte a field
    assert encoder.response() is head and encoder.trailers(0, "") is tail  # from the cache
    assert decoder.decode(head) == _RESPONSE and decoder.decode(tail) == [("grpc-status", "0")]
    failed = encoder.trailers(5, "model 'x' not found", (("retry-after", "1"),))  # adds to the table
    assert decoder.decode(failed) == [("grpc-status", "5"), ("grpc-message", "model 'x' not found"),
                                      ("retry-after", "1")]
    assert decoder.decode(encoder.response()) == _RESPONSE  # re-encoded against the table as it is now
    assert decoder.header_table.dynamic_entries.count((b"grpc-message", b"model 'x' not found")) == 0


def test_the_client_s_table_size_is_kept_and_never_exceeded():
    encoder = HeaderEncoder()
    decoder = hpack.Decoder()
    decoder.decode(encoder.response())
    encoder.resize(0)  # a client that wants no dynamic table: the next block says so, and indexes nothing
    decoder.max_allowed_table_size = 0
    block = encoder.response()
    assert block[:1] == b"\x20" and decoder.decode(block) == _RESPONSE
    assert decoder.decode(encoder.response()) == _RESPONSE and decoder.header_table_size == 0
    for size in (100, 50, 2**32 - 1):  # several SETTINGS before the next block: the smallest, then the last
        encoder.resize(size)
    decoder.max_allowed_table_size = ENCODER_TABLE_SIZE  # the last: a larger table than the default is not used
    block = encoder.trailers(0, "")
    assert block.startswith(b"\x3f\x13\x3f\xe1\x1f") and block[5] >= 0x40  # sizes 50 and 4096, then the field
    assert decoder.decode(block) == [("grpc-status", "0")] and decoder.header_table_size == ENCODER_TABLE_SIZE


def _percent_encoded(message: str) -> str:
    """gRPC's percent-encoding of a grpc-message (every byte outside printable ASCII, and %)."""
    return "".join(chr(byte) if 0x20 <= byte < 0x7F and byte != 0x25 else f"%{byte:02X}"
                   for byte in message.encode("utf-8"))


_TEXT = st.text(st.characters(codec="latin-1", exclude_characters="\r\n\x00"), max_size=40)
_BLOCK = st.one_of(
    st.tuples(st.just("response"), st.sampled_from([200, 200, 405, 415])),
    st.tuples(st.just("trailers"), st.integers(0, 20), st.text(max_size=60),
              st.lists(st.tuples(st.from_regex(r"[a-z][a-z0-9-]{0,15}", fullmatch=True), _TEXT), max_size=3),
              st.booleans()),
    st.tuples(st.just("resize"), st.sampled_from([0, 64, 200, 4096, 2**32 - 1])),
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(_BLOCK, max_size=40))
def test_any_sequence_of_blocks_decodes_to_the_fields_sent(steps):
    """One connection's blocks, read in order by a decoder that holds the encoder to the client's SETTINGS."""
    encoder, decoder = HeaderEncoder(), hpack.Decoder()
    for step in steps:
        if step[0] == "resize":
            encoder.resize(step[1])
            decoder.max_allowed_table_size = step[1]
            continue
        if step[0] == "response":
            expected = [(":status", str(step[1])), *_RESPONSE[1:]]
            block = encoder.response(step[1])
        else:
            _, code, message, metadata, headers_sent = step
            block = encoder.trailers(code, message, tuple(metadata), headers_sent)
            expected = [] if headers_sent else list(_RESPONSE)
            expected.append(("grpc-status", str(code)))
            if message:
                expected.append(("grpc-message", _percent_encoded(message)))
            expected += [(name, value) for name, value in metadata]
        assert decoder.decode(block, raw=True) == [(name.encode("latin-1"), value.encode("latin-1"))
                                                   for name, value in expected]
