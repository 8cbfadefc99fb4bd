"""The Redis response cache against a real redis-server: entries round-trip, keys are shared between
servers, TTL, password and TLS, and a Redis that is down, stalled or holds junk never fails a lookup."""

from __future__ import annotations

import asyncio
import time

import ml_dtypes
import numpy as np
import pytest
import trustme
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.core.errors import ConfigError
from appliance.engine.redis_cache import PREFIX, RedisResponseCache, decode_entry, encode_entry
from appliance.engine.shared_config import CacheConfig, RedisCacheConfig
from appliance.engine.types import InferInput
from appliance.settings import load_settings
from tests.redis_server import redis_server

IDENTITY = b"\x01" * 32
X = InferInput("x", "FP32", np.arange(6, dtype=np.float32).reshape(1, 6))


def _config(port: int, *extra: str) -> RedisCacheConfig:
    config = CacheConfig.parse(("redis,host=127.0.0.1", f"redis,port={port}", *extra))
    assert isinstance(config, RedisCacheConfig)
    return config


@pytest.fixture
def server(tmp_path):
    with redis_server(tmp_path) as running:
        yield running


def _outputs() -> dict[str, np.ndarray]:
    return {
        "y": np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4),
        "ids": np.array([[1, -2, 3]], np.int64),
        "flag": np.array([True, False]),
        "text": np.array([b"one", b"", b"three"], dtype=np.object_),
        "half": np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16),
        "scalar": np.array(7, np.int32),
        "empty": np.zeros((0, 4), np.float16),
    }


def test_an_entry_reads_back_as_stored():
    outputs = _outputs()
    stored = decode_entry(encode_entry(outputs, {"sequence": "a", "n": 3, "done": True}))
    assert stored.parameters == {"sequence": "a", "n": 3, "done": True}
    assert list(stored) == list(outputs)
    for name, array in outputs.items():
        assert stored[name].dtype == array.dtype and stored[name].shape == array.shape
        assert stored[name].tolist() == array.tolist()
        assert not stored[name].flags.writeable  # every hit hands out the same bytes


@pytest.mark.parametrize("value", [
    b"", b"ARC1", b"pickle\x80\x04", b"ARC1\xff\xff\xff\x7f{}",
    b'ARC1\x02\x00\x00\x00{}',
    b'ARC1\x0f\x00\x00\x00{"o":[],"p":[]}',
    b'ARC1\x1f\x00\x00\x00{"o":[["y","FP32",[4],16]],"p":{}}' + b"\0" * 8,  # short of its bytes
    b'ARC1\x1f\x00\x00\x00{"o":[["y","FP32",[9],16]],"p":{}}' + b"\0" * 16,  # shape and bytes disagree
    b'ARC1\x1f\x00\x00\x00{"o":[["y","NOPE",[4],16]],"p":{}}' + b"\0" * 16,
    b'ARC1\x2a\x00\x00\x00{"o":[["t","BYTES",[1000000000],8]],"p":{}}' + b"\0" * 8,  # a count no bytes hold
    b'ARC1\x0f\x00\x00\x00{"o":[],"p":{}}junk',
])
def test_anything_else_is_refused(value):
    with pytest.raises(Exception):  # noqa: B017 - which error does not matter: each is a miss to the cache
        decode_entry(value)


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=256) | st.builds(lambda tail: encode_entry(_outputs(), {})[:40] + tail,
                                           st.binary(max_size=64)))
def test_fuzzed_entries_never_read_back_as_something_unchecked(value):
    try:
        outputs = decode_entry(value)
    except Exception:
        return
    for array in outputs.values():  # what does read back is exactly what the bytes say
        assert isinstance(array, np.ndarray) and not array.flags.writeable


async def test_a_miss_is_stored_then_hit_under_a_prefixed_key(server):
    cache = RedisResponseCache(_config(server.port, "redis,ttl=300"))
    try:
        owner = cache.version_owner(IDENTITY)
        key = cache.key(owner, [X], ["y"], "")
        assert key.startswith(PREFIX)
        assert await cache.fetch(key, 0) is None
        cache.store(key, owner, _outputs(), {"p": 1})
        await asyncio.wait_for(cache.close(), 5)  # the write runs in the background; close waits for it
        assert server.keys() == [key]
        assert 0 < server.client().ttl(key) <= 300
        hit = await cache.fetch(key, 0)
        assert hit is not None and hit.parameters == {"p": 1}
        np.testing.assert_array_equal(hit["y"], _outputs()["y"])
        assert (cache.hits, cache.misses, cache.insertions, cache.failures) == (1, 1, 1, 0)
    finally:
        await cache.close()


async def test_two_servers_share_the_keys_of_the_same_model_and_not_of_another(server):
    first, second = RedisResponseCache(_config(server.port)), RedisResponseCache(_config(server.port))
    try:
        key = first.key(first.version_owner(IDENTITY), [X], ["y"], "")
        assert second.key(second.version_owner(IDENTITY), [X], ["y"], "") == key
        assert second.key(second.version_owner(b"\x02" * 32), [X], ["y"], "") != key  # other files or config
        assert first.version_owner(None) != second.version_owner(None)  # no identity: a load's own namespace
        first.store(key, IDENTITY, _outputs(), None)
        await first.close()
        assert await second.fetch(key, 0) is not None
    finally:
        await first.close()
        await second.close()


async def test_a_server_that_is_down_costs_a_timeout_once_then_nothing(tmp_path):
    with redis_server(tmp_path) as gone:
        port = gone.port
    cache = RedisResponseCache(_config(port, "redis,socket_timeout=50", "redis,connect_timeout=50"))
    try:
        key = cache.key(cache.version_owner(IDENTITY), [X], ["y"], "")
        assert await asyncio.wait_for(cache.fetch(key, 0), 2) is None
        assert cache.failures == 1
        started = time.monotonic()
        for _ in range(20):  # the back-off: not tried again at once
            assert await cache.fetch(key, 0) is None
            assert cache.store(key, IDENTITY, _outputs(), None) is None
        assert time.monotonic() - started < 0.5
        assert cache.failures == 1 and cache.skipped == 40
        assert ("appliance_response_cache_redis_failures" in {name for name, _, _ in cache.gauges()})
    finally:
        await cache.close()


async def test_a_stalled_server_is_a_miss_within_the_socket_timeout(server):
    cache = RedisResponseCache(_config(server.port, "redis,socket_timeout=100"))
    key = cache.key(cache.version_owner(IDENTITY), [X], ["y"], "")
    try:
        assert await cache.fetch(key, 0) is None  # connected
        server.pause()
        started = time.monotonic()
        assert await asyncio.wait_for(cache.fetch(key, 0), 3) is None
        assert time.monotonic() - started < 1.0
        assert cache.failures == 1
    finally:
        server.resume()
        await cache.close()


async def test_junk_under_a_key_is_a_counted_miss(server):
    cache = RedisResponseCache(_config(server.port))
    key = cache.key(cache.version_owner(IDENTITY), [X], ["y"], "")
    server.client().set(key, b"\x80\x04\x95 not an entry")
    try:
        assert await cache.fetch(key, 0) is None
        assert (cache.hits, cache.failures) == (0, 1)
    finally:
        await cache.close()


async def test_responses_over_max_entry_size_are_not_stored(server):
    cache = RedisResponseCache(_config(server.port, "redis,max_entry_size=1024"))
    key = cache.key(cache.version_owner(IDENTITY), [X], ["y"], "")
    try:
        cache.store(key, IDENTITY, {"y": np.zeros(1024, np.float32)}, None)
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
            assert await wrong.fetch(key, 0) is None and wrong.failures == 1
            right.store(key, IDENTITY, _outputs(), None)
            await right.close()
            assert await right.fetch(key, 0) is not None and right.failures == 0
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
            trusted.store(key, IDENTITY, _outputs(), None)
            await trusted.close()
            assert await trusted.fetch(key, 0) is not None and trusted.failures == 0
            assert await untrusted.fetch(key, 0) is None and untrusted.failures == 1
        finally:
            await trusted.close()
            await untrusted.close()


async def test_a_busy_pool_is_skipped_not_counted_as_a_failing_server(server):
    cache = RedisResponseCache(_config(server.port, "redis,pool_size=1", "redis,wait_timeout=20",
                                       "redis,socket_timeout=300"))
    key = cache.key(cache.version_owner(IDENTITY), [X], ["y"], "")
    try:
        assert await cache.fetch(key, 0) is None  # connected
        server.pause()
        slow, busy = await asyncio.gather(cache.fetch(key, 0), cache.fetch(key, 0))
        assert slow is None and busy is None
        assert (cache.failures, cache.skipped) == (1, 1)
    finally:
        server.resume()
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
            assert await wrong.fetch(key, 0) is None and wrong.failures == 1  # the cache_config's password wins
            right.store(key, IDENTITY, _outputs(), None)
            await right.close()
            assert await right.fetch(key, 0) is not None and right.failures == 0
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
