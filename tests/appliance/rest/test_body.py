"""The body reader on requests whose stream the test feeds: size, time, memory and content coding."""

from __future__ import annotations

import asyncio
import gzip
import threading
import time
import zlib
from unittest import mock

import pytest
from aiohttp import streams, web
from aiohttp.test_utils import make_mocked_request

from appliance.core.errors import InvalidInput, PayloadTooLarge, RequestTimeout, Unavailable, UnsupportedEncoding
from appliance.protocol import inflate as inflate_module
from appliance.protocol.inflate import DEFAULT_RATIO
from appliance.rest.body import BodyLimits, read_body
from appliance.security.budget import MemoryBudget

LIMIT = 1 << 20


def _request(headers: dict[str, str] | None = None) -> tuple[web.Request, streams.StreamReader]:
    protocol = mock.Mock(_reading_paused=False)
    reader = streams.StreamReader(protocol, 2**16, loop=asyncio.get_running_loop())
    return make_mocked_request("POST", "/v2/models/m/infer", headers=headers or {}, payload=reader), reader


def _send(reader: streams.StreamReader, body: bytes, pieces: int = 4) -> None:
    step = max(1, len(body) // pieces)
    for start in range(0, len(body), step):
        reader.feed_data(body[start:start + step])
    reader.feed_eof()


async def _read(headers: dict[str, str], body: bytes | None, budget: MemoryBudget | None = None,
                limit: int = LIMIT, timeout: float = 5.0, ratio: int = DEFAULT_RATIO) -> tuple[bytes, int]:
    request, reader = _request(headers)
    if body is not None:
        _send(reader, body)
    budget = budget or MemoryBudget(64 * LIMIT)
    with budget.account() as account:
        data = await read_body(request, account, BodyLimits(limit, timeout, ratio))
        return data, account.held


async def test_reads_in_chunks_and_reserves_what_it_holds():
    body = bytes(range(256)) * 1000
    data, held = await _read({}, body)
    assert data == body and held == len(body)


async def test_declared_length_over_the_limit_is_413_before_reading():
    started = time.monotonic()
    with pytest.raises(PayloadTooLarge, match="max_request_bytes") as refused:
        await _read({"Content-Length": str(LIMIT + 1)}, None, timeout=5)  # nothing is ever sent
    # Triton's words, as its qa L0_http test_loading_large_invalid_model checks them
    assert f"request JSON size of {LIMIT + 1} bytes exceeds the maximum allowed input size. " in str(refused.value)
    assert time.monotonic() - started < 1


async def test_chunked_body_over_the_limit_is_413_without_holding_it():
    budget = MemoryBudget(LIMIT + 65536)
    with pytest.raises(PayloadTooLarge, match="max_request_bytes"):
        await _read({"Transfer-Encoding": "chunked"}, b"x" * (3 * LIMIT), budget)
    assert budget.used == 0


async def test_a_stalled_body_is_408():
    request, reader = _request({"Content-Length": "1000"})
    reader.feed_data(b"x" * 10)  # 10 of 1000 declared bytes, then nothing
    started = time.monotonic()
    with MemoryBudget(LIMIT).account() as account, pytest.raises(RequestTimeout, match="body_timeout"):
        await read_body(request, account, BodyLimits(LIMIT, 0.3))
    assert 0.25 < time.monotonic() - started < 2


async def test_the_timeout_is_per_read_not_per_body():
    request, reader = _request({})

    async def trickle() -> None:
        for _ in range(6):
            await asyncio.sleep(0.1)
            reader.feed_data(b"abc")
        reader.feed_eof()

    feeder = asyncio.create_task(trickle())
    with MemoryBudget(LIMIT).account() as account:
        data = await read_body(request, account, BodyLimits(LIMIT, 0.3))  # 0.6 s in all, 0.1 s per read
    await feeder
    assert data == b"abc" * 6


async def test_a_broken_body_is_400():
    request, reader = _request({})
    reader.set_exception(web.RequestPayloadError("chunk size is not a number"))
    with MemoryBudget(LIMIT).account() as account, pytest.raises(InvalidInput, match="malformed"):
        await read_body(request, account, BodyLimits(LIMIT, 1))


async def test_past_the_memory_budget_is_503():
    budget = MemoryBudget(4 * LIMIT)
    with budget.account() as other:
        other.reserve(3 * LIMIT + LIMIT // 2)  # requests in flight hold most of the budget
        with pytest.raises(Unavailable, match="max_request_memory_bytes") as raised:
            await _read({}, b"x" * LIMIT, budget)
        assert raised.value.retry_after == 1
    assert budget.used == 0


@pytest.mark.parametrize("coding,compress", [
    ("gzip", gzip.compress),
    ("x-gzip", gzip.compress),
    ("deflate", zlib.compress),  # RFC 9110: zlib-wrapped
    ("deflate", lambda data: zlib.compress(data, wbits=-15)),  # what some clients send: raw deflate
    ("GZip, identity", gzip.compress),
])
async def test_compressed_bodies_are_inflated(coding, compress):
    body = b'{"inputs": []}' * 5000
    data, held = await _read({"Content-Encoding": coding}, compress(body))
    assert data == body and held == len(body)  # the compressed copy is no longer counted


async def test_gzip_members_are_concatenated():
    data, _ = await _read({"Content-Encoding": "gzip"}, gzip.compress(b"first ") + gzip.compress(b"second"))
    assert data == b"first second"


async def test_a_gzip_bomb_stops_at_the_limit():
    bomb = gzip.compress(b"\0" * (64 * LIMIT), 9)  # 64 MiB from ~64 KiB
    assert len(bomb) < LIMIT
    # A budget that one inflated limit fits in: inflating past the limit would be a 503, not a 413.
    budget = MemoryBudget(LIMIT + len(bomb) + 2 * (1 << 20))
    with pytest.raises(PayloadTooLarge, match="inflates to more than"):
        await _read({"Content-Encoding": "gzip"}, bomb, budget)
    assert budget.used == 0


@pytest.mark.parametrize("coding,body,message", [
    ("gzip", b"\x1f\x8b not gzip at all" * 100, "not valid gzip"),
    ("deflate", b"\x00\x01\x02" * 1000, "not valid deflate"),
    ("gzip", gzip.compress(b"x" * 100_000, mtime=0)[:-200], "truncated"),
    ("deflate", zlib.compress(b"abc") + b"junk", "data after its end"),
])
async def test_junk_compressed_data_is_400(coding, body, message):
    with pytest.raises(InvalidInput, match=message):
        await _read({"Content-Encoding": coding}, body)


@pytest.mark.parametrize("coding", ["br", "zstd", "gzip, gzip", "compress"])
async def test_unknown_codings_are_415_naming_the_accepted_ones(coding):
    with pytest.raises(UnsupportedEncoding, match="gzip or deflate") as raised:
        await _read({"Content-Encoding": coding}, b"x")
    assert "gzip" in raised.value.accepted and "deflate" in raised.value.accepted


async def test_large_bodies_inflate_off_the_event_loop():
    """A body that may inflate past INLINE_BYTES is inflated on a worker thread, a small one in place (told
    by the thread that runs ``inflate``, not by timing the loop: a shared box's stalls would decide)."""
    threads: list[int] = []
    real = inflate_module.inflate

    def spied(*args, **kwargs):
        threads.append(threading.get_ident())
        return real(*args, **kwargs)

    loop_thread = threading.get_ident()
    with mock.patch.object(inflate_module, "inflate", spied):
        data, _ = await _read({"Content-Encoding": "gzip"}, gzip.compress(b"\0" * (64 * LIMIT), 9),
                              MemoryBudget(256 * LIMIT), limit=64 * LIMIT, ratio=0)
        small, _ = await _read({"Content-Encoding": "gzip"}, gzip.compress(b"small"))
    assert len(data) == 64 * LIMIT and small == b"small"
    assert threads[0] != loop_thread and threads[1] == loop_thread
