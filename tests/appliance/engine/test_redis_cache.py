"""The Redis response cache against a real redis-server: entries round-trip, keys are shared between
servers given the same secret (and only then), TTL, password and TLS, a Redis that is down, stalled or holds
junk never fails a lookup, and whoever writes to it answers for no model: an entry overwritten, written with
another key, of other datatypes or shapes than the model's, too large, or of an older format is a miss, and
a large one is read within the memory budget without stalling the loop."""

from __future__ import annotations

import asyncio
import contextlib
import time
import tracemalloc
from collections.abc import AsyncIterator

import numpy as np
import pytest
import trustme

from appliance.core.errors import ConfigError
from appliance.core.tensors import v2_datatype
from appliance.engine.redis_cache import PREFIX, RedisResponseCache
from appliance.engine.redis_entry import EntryKeys, encode_entry
from appliance.engine.response_cache import OutputForms
from appliance.engine.shared_config import CacheConfig, RedisCacheConfig
from appliance.engine.types import InferInput
from appliance.security.budget import MemoryBudget
from appliance.settings import load_settings
from tests.builders import mixed_outputs
from tests.redis_server import redis_server
from tests.waiting import next_turn

IDENTITY = b"\x01" * 32
X = InferInput("x", "FP32", np.arange(6, dtype=np.float32).reshape(1, 6))


def _key(cache: RedisResponseCache) -> bytes:
    """The key of IDENTITY's answer to X, asking for y."""
    return cache.key(cache.version_owner(IDENTITY), [X], ["y"], "")


def _config(port: int, *extra: str) -> RedisCacheConfig:
    config = CacheConfig.parse(("redis,host=127.0.0.1", f"redis,port={port}", *extra))
    assert isinstance(config, RedisCacheConfig)
    return config


@pytest.fixture
def server(tmp_path):
    with redis_server(tmp_path) as running:
        yield running


FORMS = OutputForms("m", {name: (v2_datatype(array.dtype), array.shape) for name, array in mixed_outputs().items()},
                    batched=False)
SHARED = EntryKeys.of(b"the fleet's secret, 32 bytes long", shared=True)


async def _fetch(cache: RedisResponseCache, key: bytes, forms: OutputForms = FORMS, batch: int = 1):
    return await cache.fetch(key, 0, forms, batch)


def _store(cache: RedisResponseCache, key: bytes, outputs, parameters=None, forms: OutputForms = FORMS,
           batch: int = 1):
    return cache.store(key, IDENTITY, outputs, parameters, forms, batch)


async def test_a_miss_is_stored_then_hit_under_a_prefixed_key(server):
    cache = RedisResponseCache(_config(server.port, "redis,ttl=300"))
    try:
        owner = cache.version_owner(IDENTITY)
        key = cache.key(owner, [X], ["y"], "")
        assert key.startswith(PREFIX)
        assert await _fetch(cache, key) is None
        _store(cache, key, mixed_outputs(), {"p": 1})
        await asyncio.wait_for(cache.close(), 5)  # the write runs in the background; close waits for it
        assert server.keys() == [key]
        assert 0 < server.client().ttl(key) <= 300
        hit = await _fetch(cache, key)
        assert hit is not None and hit.parameters == {"p": 1}
        np.testing.assert_array_equal(hit["y"], mixed_outputs()["y"])
        assert (cache.hits, cache.misses, cache.insertions, cache.failures) == (1, 1, 1, 0)
    finally:
        await cache.close()


async def test_two_servers_with_the_same_secret_share_the_keys_of_the_same_model_and_not_of_another(server):
    first, second = RedisResponseCache(_config(server.port), SHARED), RedisResponseCache(_config(server.port), SHARED)
    try:
        key = first.key(first.version_owner(IDENTITY), [X], ["y"], "")
        assert second.key(second.version_owner(IDENTITY), [X], ["y"], "") == key
        assert second.key(second.version_owner(b"\x02" * 32), [X], ["y"], "") != key  # other files or config
        assert first.version_owner(None) != second.version_owner(None)  # no identity: a load's own namespace
        _store(first, key, mixed_outputs(), None)
        await first.close()
        assert await _fetch(second, key) is not None
    finally:
        await first.close()
        await second.close()


async def test_a_server_that_is_down_costs_a_timeout_once_then_nothing(tmp_path):
    with redis_server(tmp_path) as gone:
        port = gone.port
    cache = RedisResponseCache(_config(port, "redis,socket_timeout=50", "redis,connect_timeout=50"))
    try:
        key = _key(cache)
        assert await asyncio.wait_for(_fetch(cache, key), 2) is None
        assert cache.failures == 1
        started = time.monotonic()
        for _ in range(20):  # the back-off: not tried again at once
            assert await _fetch(cache, key) is None
            assert _store(cache, key, mixed_outputs(), None) is None
        assert time.monotonic() - started < 0.5
        assert cache.failures == 1 and cache.skipped == 40
        assert ("appliance_response_cache_redis_failures" in {name for name, _, _ in cache.gauges()})
    finally:
        await cache.close()


async def test_a_stalled_server_is_a_miss_within_the_socket_timeout(server):
    cache = RedisResponseCache(_config(server.port, "redis,socket_timeout=100"))
    key = _key(cache)
    try:
        assert await _fetch(cache, key) is None  # connected
        server.pause()
        started = time.monotonic()
        assert await asyncio.wait_for(_fetch(cache, key), 3) is None
        assert time.monotonic() - started < 1.0
        assert cache.failures == 1
    finally:
        server.resume()
        await cache.close()


async def test_junk_under_a_key_is_a_counted_miss(server):
    cache = RedisResponseCache(_config(server.port))
    key = _key(cache)
    server.client().set(key, b"\x80\x04\x95 not an entry")
    try:
        assert await _fetch(cache, key) is None
        assert (cache.hits, cache.failures) == (0, 1)
    finally:
        await cache.close()


async def test_responses_over_max_entry_size_are_not_stored(server):
    cache = RedisResponseCache(_config(server.port, "redis,max_entry_size=1024"))
    key = _key(cache)
    try:
        _store(cache, key, {"y": np.zeros(1024, np.float32)}, None, OutputForms("m", {"y": ("FP32", (-1,))}, False))
        await cache.close()
        assert server.keys() == [] and cache.skipped == 1
    finally:
        await cache.close()


async def test_user_and_password(tmp_path):
    with redis_server(tmp_path, password="s3cret") as server:
        right = RedisResponseCache(_config(server.port, "redis,password=s3cret", "redis,user=default"))
        wrong = RedisResponseCache(_config(server.port, "redis,password=wrong"))
        key = right.key(right.version_owner(IDENTITY), [X], ["y"], "")
        try:
            assert await _fetch(wrong, key) is None and wrong.failures == 1
            _store(right, key, mixed_outputs(), None)
            await right.close()
            assert await _fetch(right, key) is not None and right.failures == 0
        finally:
            await right.close()
            await wrong.close()


async def test_tls_with_the_servers_ca_and_a_client_certificate(tmp_path):
    ca = trustme.CA()
    served = ca.issue_cert("127.0.0.1")
    paths = {"cert": tmp_path / "server.pem", "key": tmp_path / "server.key", "ca": tmp_path / "ca.pem"}
    served.cert_chain_pems[0].write_to_path(paths["cert"])
    served.private_key_pem.write_to_path(paths["key"])
    ca.cert_pem.write_to_path(paths["ca"])
    client = ca.issue_cert("appliance")
    client.cert_chain_pems[0].write_to_path(tmp_path / "client.pem")
    client.private_key_pem.write_to_path(tmp_path / "client.key")
    with redis_server(tmp_path, tls=paths) as server:
        trusted = RedisResponseCache(_config(server.port, f"redis,cacert={paths['ca']}",
                                             f"redis,cert={tmp_path / 'client.pem'}",
                                             f"redis,key={tmp_path / 'client.key'}"))
        untrusted = RedisResponseCache(_config(server.port, "redis,tls_enabled=true"))  # the system's CAs only
        key = trusted.key(trusted.version_owner(IDENTITY), [X], ["y"], "")
        try:
            assert trusted.config.tls
            _store(trusted, key, mixed_outputs(), None)
            await trusted.close()
            assert await _fetch(trusted, key) is not None and trusted.failures == 0
            assert await _fetch(untrusted, key) is None and untrusted.failures == 1
        finally:
            await trusted.close()
            await untrusted.close()


async def test_a_busy_pool_is_skipped_not_counted_as_a_failing_server(server):
    cache = RedisResponseCache(_config(server.port, "redis,pool_size=1", "redis,wait_timeout=20",
                                       "redis,socket_timeout=300"))
    key = _key(cache)
    try:
        assert await _fetch(cache, key) is None  # connected
        server.pause()
        slow, busy = await asyncio.gather(_fetch(cache, key), _fetch(cache, key))
        assert slow is None and busy is None
        assert (cache.failures, cache.skipped) == (1, 1)
    finally:
        server.resume()
        await cache.close()


async def test_servers_without_the_same_secret_share_nothing(server):
    mine, theirs = RedisResponseCache(_config(server.port)), RedisResponseCache(_config(server.port))
    try:
        key = mine.key(mine.version_owner(IDENTITY), [X], ["y"], "")
        assert theirs.key(theirs.version_owner(IDENTITY), [X], ["y"], "") != key  # they never look at it
        _store(theirs, key, mixed_outputs(), None)  # even written under my key, with their own
        await theirs.close()
        assert server.keys() == [key]
        assert await _fetch(mine, key) is None
        assert (mine.hits, mine.failures) == (0, 1)
    finally:
        await mine.close()
        await theirs.close()


def _forged(key: bytes, outputs: dict[str, np.ndarray], keys: EntryKeys) -> bytes:
    return encode_entry(key, outputs, None, keys)


async def test_an_overwritten_entry_is_not_served(server):
    cache = RedisResponseCache(_config(server.port), SHARED)
    key = _key(cache)
    try:
        _store(cache, key, mixed_outputs(), None)
        await cache.close()
        assert await _fetch(cache, key) is not None
        forged = {**mixed_outputs(), "ids": np.array([[1337, 1337, 1337]], np.int64)}  # well formed, signed otherwise
        server.client().set(key, _forged(key, forged, EntryKeys.of(b"a guess at the secret, 32 bytes!", True)))
        assert await _fetch(cache, key) is None
        tampered = bytearray(_forged(key, mixed_outputs(), SHARED))
        tampered[-10] ^= 0xFF  # one byte changed on the server
        server.client().set(key, bytes(tampered))
        assert await _fetch(cache, key) is None
        other = cache.key(cache.version_owner(IDENTITY), [X], ["z"], "")
        server.client().set(key, _forged(other, forged, SHARED))  # signed, but for another request
        assert await _fetch(cache, key) is None
        assert (cache.hits, cache.failures) == (1, 3)
    finally:
        await cache.close()


@pytest.mark.parametrize(("outputs", "forms", "batch"), [
    ({"y": np.array([b"pwned!"], object)}, OutputForms("m", {"y": ("FP32", (4,))}, False), 1),  # BYTES for FP32
    ({"y": np.zeros(5, np.float32)}, OutputForms("m", {"y": ("FP32", (4,))}, False), 1),
    ({"y": np.zeros((3, 4), np.float32)}, OutputForms("m", {"y": ("FP32", (4,))}, True), 2),  # rows != batch
    ({"z": np.zeros(4, np.float32)}, OutputForms("m", {"y": ("FP32", (4,))}, False), 1),  # not an output
])
async def test_a_signed_entry_that_is_not_the_models_outputs_is_not_served(server, outputs, forms, batch, caplog):
    cache = RedisResponseCache(_config(server.port), SHARED)
    key = _key(cache)
    try:
        server.client().set(key, _forged(key, outputs, SHARED))  # whoever holds the secret, or a model gone wrong
        for _ in range(3):
            assert await _fetch(cache, key, forms, batch) is None
        assert (cache.hits, cache.misses, cache.failures) == (0, 3, 3)
        refusals = [r for r in caplog.records if "refused" in r.getMessage()]
        assert len(refusals) == 1 and "not the model's answer" in refusals[0].getMessage()  # once a minute
    finally:
        await cache.close()


async def test_outputs_that_are_not_the_models_are_not_written(server):
    cache = RedisResponseCache(_config(server.port), SHARED)
    key = _key(cache)
    try:
        _store(cache, key, {"y": np.zeros(3, np.int64)}, None, OutputForms("m", {"y": ("FP32", (3,))}, False))
        await cache.close()
        assert server.keys() == [] and cache.skipped == 1
    finally:
        await cache.close()


async def test_an_entry_of_the_old_unsigned_format_is_a_miss(server):
    cache = RedisResponseCache(_config(server.port), SHARED)
    key = _key(cache)
    header = b'{"o":[["y","FP32",[4],16]],"p":{}}'
    old = b"ARC1" + len(header).to_bytes(4, "little") + header + np.full(4, 1337, np.float32).tobytes()
    server.client().set(key, old)
    server.client().set(b"appliance:rc1:" + key[len(PREFIX):], old)
    try:
        assert await _fetch(cache, key, OutputForms("m", {"y": ("FP32", (4,))}, False)) is None
        assert (cache.hits, cache.failures) == (0, 1)
    finally:
        await cache.close()


@contextlib.asynccontextmanager
async def _loop_stalls() -> AsyncIterator[list[float]]:
    """The longest the event loop went without running a 10 ms ticker (past those 10 ms), in [0]."""
    longest = [0.0]

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            longest[0] = max(longest[0], now - last - 0.01)
            last = now

    ticker = asyncio.create_task(tick())
    await next_turn()  # the ticker starts before what it watches
    try:
        yield longest
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker


def _empty_strings(key: bytes, count: int, keys: EntryKeys) -> bytes:
    """A signed entry of ``count`` empty BYTES elements, built without making them (4 zero bytes each)."""
    header = f'{{"o":[["t","BYTES",[{count}],{4 * count}]],"p":{{}}}}'.encode()
    body = len(header).to_bytes(4, "little") + header + bytes(4 * count)
    return b"ARC2" + keys.tag(key, body) + body


BIG = OutputForms("m", {"t": ("BYTES", (-1,))}, False)


async def test_an_entry_over_max_entry_size_is_refused_unread(server):
    cache = RedisResponseCache(_config(server.port, "redis,socket_timeout=2000"), SHARED)
    key = cache.key(cache.version_owner(IDENTITY), [X], ["t"], "")
    server.client().set(key, _empty_strings(key, 4 << 20, SHARED))  # 16 MiB of 4 Mi empty elements
    try:
        assert await _fetch(cache, key, BIG) is None  # connected
        tracemalloc.start()
        try:
            async with _loop_stalls() as stalled:
                assert await _fetch(cache, key, BIG) is None
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 4 << 20  # the 16 MiB were never read (the first 64 KiB were)
        assert stalled[0] < 0.2
        assert (cache.hits, cache.failures) == (0, 2)
    finally:
        await cache.close()


async def test_a_large_entry_is_read_within_the_memory_budget_off_the_loop(server):
    budget = MemoryBudget(64 << 20)
    config = _config(server.port, "redis,socket_timeout=2000", f"redis,max_entry_size={32 << 20}")
    cache = RedisResponseCache(config, SHARED, budget)
    key = cache.key(cache.version_owner(IDENTITY), [X], ["t"], "")
    try:
        # 4 Mi empty elements would take 4 Mi objects (~170 MiB) decoded: over the budget, never made.
        server.client().set(key, _empty_strings(key, 4 << 20, SHARED))
        assert await _fetch(cache, key, BIG) is None  # connected
        async with _loop_stalls() as stalled:
            assert await _fetch(cache, key, BIG) is None
        assert stalled[0] < 0.2
        assert (cache.hits, cache.failures, cache.skipped) == (0, 0, 2) and budget.used == 0
        # Within the budget it is served, decoded off the loop all the same.
        server.client().set(key, _empty_strings(key, 256 << 10, SHARED))
        async with _loop_stalls() as stalled:
            hit = await _fetch(cache, key, BIG)
        assert hit is not None and hit["t"].shape == (256 << 10,) and hit["t"][0] == b""
        assert stalled[0] < 0.2 and budget.used == 0
        # A budget others have spent: a miss (skipped), not an error.
        with budget.account() as others:
            others.reserve(60 << 20)
            assert await _fetch(cache, key, BIG) is None
        assert cache.skipped == 3
    finally:
        await cache.close()


async def test_a_large_response_is_written_from_a_copy_and_read_back(server):
    cache = RedisResponseCache(_config(server.port, "redis,socket_timeout=2000"), SHARED)
    key = _key(cache)
    forms = OutputForms("m", {"y": ("FP32", (-1,)), "t": ("BYTES", (-1,))}, True)
    outputs = {"y": np.arange(1 << 20, dtype=np.float32).reshape(1, -1), "t": np.array([[b"a", b"bc"]], object)}
    try:
        _store(cache, key, outputs, None, forms)
        outputs["y"][:] = 0  # the runtime reuses its buffer once the response is out
        await cache.close()
        hit = await _fetch(cache, key, forms)
        assert hit is not None and hit["y"][0, 12345] == 12345 and hit["t"].tolist() == [[b"a", b"bc"]]
        assert (cache.insertions, cache.failures) == (1, 0)
    finally:
        await cache.close()


async def test_another_type_of_value_under_a_key_is_a_miss_not_an_outage(server):
    cache = RedisResponseCache(_config(server.port), SHARED)
    key = _key(cache)
    server.client().rpush(key, b"a list")
    try:
        assert await _fetch(cache, key) is None
        assert cache.failures == 1
        other = cache.key(cache.version_owner(IDENTITY), [X], ["z"], "")
        assert await _fetch(cache, other) is None and cache.skipped == 0  # no back-off: the server is fine
    finally:
        await cache.close()


def _settings_cache(port: int, env: dict[str, str], *extra: str) -> RedisCacheConfig:
    settings = load_settings({"cache_config": ("redis,host=127.0.0.1", f"redis,port={port}", *extra)}, env)
    config = settings.response_cache.parsed
    assert isinstance(config, RedisCacheConfig)
    return config


async def test_credentials_from_tritons_environment_variables(tmp_path):
    with redis_server(tmp_path, password="s3cret") as server:
        from_env = _settings_cache(server.port, {"TRITONCACHE_REDIS_USERNAME": "default",
                                                 "TRITONCACHE_REDIS_PASSWORD": "s3cret"})
        overridden = _settings_cache(server.port, {"TRITONCACHE_REDIS_PASSWORD": "s3cret"}, "redis,password=wrong")
        assert "s3cret" not in repr(load_settings({}, {"TRITONCACHE_REDIS_PASSWORD": "s3cret"}))
        right, wrong = RedisResponseCache(from_env), RedisResponseCache(overridden)
        key = right.key(right.version_owner(IDENTITY), [X], ["y"], "")
        try:
            assert (from_env.user, from_env.password) == ("default", "s3cret")
            assert await _fetch(wrong, key) is None and wrong.failures == 1  # the cache_config's password wins
            _store(right, key, mixed_outputs(), None)
            await right.close()
            assert await _fetch(right, key) is not None and right.failures == 0
        finally:
            await right.close()
            await wrong.close()


@pytest.mark.parametrize(("extra", "tls"), [
    ((), False),
    (("redis,tls_enabled=true",), True),  # Triton's name
    (("redis,tls=true",), True),
    (("redis,cacert=/ca.pem",), True),  # a TLS file alone turns TLS on
    (("redis,tls_enabled=true", "redis,cacert=/ca.pem"), True),
])
def test_tls_settings(extra, tls):
    assert _config(6379, *extra).tls is tls


@pytest.mark.parametrize(("extra", "words"), [
    (("redis,tls_enabled=false", "redis,cacert=/ca.pem"), "set redis,tls_enabled=true"),
    (("redis,tls_enabled=true", "redis,tls=false"), "disagree"),
    (("redis,tls_enabled=maybe",), "must be true or false"),
    (("redis,cert=/c.pem",), "give both or neither"),
])
def test_contradicting_tls_settings_are_refused_with_the_fix(extra, words):
    with pytest.raises(ConfigError, match=words):
        _config(6379, *extra)
