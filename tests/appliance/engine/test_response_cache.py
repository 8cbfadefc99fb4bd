"""The response cache itself: its setting, the request key (what must and must not change it), LRU
within the byte bound, what it keeps, and its counters."""

from __future__ import annotations

import numpy as np
import pytest

from appliance.core.errors import ConfigError
from appliance.engine.response_cache import ENTRY_OVERHEAD, ResponseCache, request_key
from appliance.engine.shared_config import CacheConfig, RedisCacheConfig
from appliance.engine.types import InferInput


@pytest.mark.parametrize("entries, size", [
    (("local,size=1048576",), 1048576),
    (("local", "size=4096"), 4096),  # a comma-separated setting from the environment arrives split
    ((" local , size = 2048 ",), 2048),
])
def test_cache_config_is_tritons_local_cache(entries, size):
    assert CacheConfig.parse(entries) == CacheConfig(size)


def test_redis_cache_config_takes_tritons_settings():
    config = CacheConfig.parse(("redis,host=10.0.0.5", "redis,port=6380", "redis,user=app", "redis,password=s3cret",
                                "redis,socket_timeout=20", "redis,ttl=60", "redis,cacert=/etc/ca.pem"))
    assert isinstance(config, RedisCacheConfig)
    assert (config.host, config.port, config.user, config.password) == ("10.0.0.5", 6380, "app", "s3cret")
    assert (config.socket_timeout_ms, config.ttl, config.cacert, config.tls) == (20, 60, "/etc/ca.pem", True)
    assert "s3cret" not in repr(config)
    defaults = CacheConfig.parse(("redis,host=h,port=1,socket_timeout=0",))
    assert isinstance(defaults, RedisCacheConfig)
    # Triton's 0 waits forever; a request here never waits on the cache past the default.
    assert (defaults.socket_timeout_ms, defaults.tls, defaults.ttl) == (100, False, 0)


def test_no_cache_config_is_no_cache():
    assert CacheConfig.parse(()) is None


@pytest.mark.parametrize("entry, message", [
    ("memcached,size=4096", "unknown cache 'memcached'"),
    ("local,size=4096,redis", "names two caches"),
    ("redis,host=box", "needs its address"),
    ("redis,host=box,port=6379,ttl=soon", "redis ttl must be seconds"),
    ("redis,host=box,port=70000", "not a TCP port"),
    ("redis,host=box,port=1,cert=c.pem", "cert and key go together"),
    ("redis,host=box,port=1,tls=maybe", "must be true or false"),
    ("redis,host=box,port=1,size=5", "redis cache has no setting size"),
    ("redis,host=box,port=1,sni=redis.lan", "give the name the server's certificate holds"),
    ("size=4096", "no cache specified"),
    ("local", "needs its size"),
    ("local,size=lots", "must be a number of bytes"),
    ("local,size=100", "too small"),
    ("local,ttl=5,size=4096", "no setting ttl"),
    ("local,size=", "option format"),
])
def test_bad_cache_config_says_what_to_write(entry, message):
    with pytest.raises(ConfigError, match=message):
        CacheConfig.parse((entry,))


def _input(name: str, data: np.ndarray, datatype: str = "FP32") -> InferInput:
    return InferInput(name, datatype, data)


OWNER = ResponseCache.owner()


def _key(*inputs: InferInput, outputs=("y",), parameters="", owner=OWNER) -> bytes:
    return request_key(owner, list(inputs), outputs, parameters)


def test_the_same_request_has_the_same_key_whatever_the_input_order():
    a, b = np.arange(4, dtype=np.float32), np.ones(3, np.float32)
    assert _key(_input("a", a), _input("b", b)) == _key(_input("b", b.copy()), _input("a", a.copy()))


def test_every_part_of_an_input_is_in_the_key():
    data = np.arange(4, dtype=np.float32)
    base = _key(_input("x", data))
    assert _key(_input("z", data)) != base  # name
    assert _key(_input("x", data.view(np.int32), "INT32")) != base  # datatype: the very same bytes
    assert _key(_input("x", data.reshape(2, 2))) != base  # shape: the same bytes (Triton's key misses this)
    changed = data.copy()
    changed[3] = 3.5
    assert _key(_input("x", changed)) != base  # bytes
    assert _key(_input("x", data.reshape(2, 2).T)) == _key(_input("x", np.ascontiguousarray(data.reshape(2, 2).T)))


def test_bytes_elements_are_delimited():
    split_one = np.array([b"ab", b"c"], dtype=object)
    split_two = np.array([b"a", b"bc"], dtype=object)
    assert _key(_input("s", split_one, "BYTES")) != _key(_input("s", split_two, "BYTES"))


def test_requested_outputs_parameters_and_version_are_in_the_key():
    x = _input("x", np.zeros(2, np.float32))
    base = _key(x, outputs=("y", "z"))
    assert _key(x, outputs=("z", "y", "y")) == base  # a set: order and repeats do not matter
    assert _key(x, outputs=("y",)) != base
    assert _key(x, outputs=("y", "z"), parameters='{"threshold": 0.5}') != base
    assert _key(x, outputs=("y", "z"), owner=ResponseCache.owner()) != base  # another (re)loaded version


def _outputs(size: int, fill: float = 1.0) -> dict[str, np.ndarray]:
    return {"y": np.full(size // 4, fill, np.float32)}


def test_least_recently_used_entries_leave_first_within_the_byte_bound():
    entry = ENTRY_OVERHEAD + 1 + 400  # overhead, the name "y", 100 floats
    cache = ResponseCache(3 * entry)
    for key in (b"a", b"b", b"c"):
        assert cache.insert(key, OWNER, _outputs(400)) is not None
    assert cache.lookup(b"a") is not None  # a is now the most recently used: b goes first
    cache.insert(b"d", OWNER, _outputs(400))
    assert cache.lookup(b"b") is None
    assert all(cache.lookup(key) is not None for key in (b"a", b"c", b"d"))
    assert cache.used == 3 * entry <= cache.capacity
    assert (cache.entries, cache.evictions, cache.insertions) == (3, 1, 4)
    assert (cache.hits, cache.misses, cache.lookups) == (4, 1, 5)
    assert cache.utilization == 1.0


def test_a_response_larger_than_the_cache_is_not_kept():
    cache = ResponseCache(1024)
    cache.insert(b"small", OWNER, _outputs(16))
    assert cache.insert(b"big", OWNER, _outputs(4096)) is None
    assert cache.lookup(b"big") is None and cache.lookup(b"small") is not None  # nothing evicted for it


def test_kept_outputs_are_read_only_compact_copies_with_their_parameters():
    batch = np.arange(64, dtype=np.float32).reshape(8, 8)
    row = batch[2:3]  # one request's rows of a batch's output
    cache = ResponseCache(1 << 20)
    stored = cache.insert(b"k", OWNER, {"y": row}, {"label": "cat"})
    assert stored is not None
    kept = stored["y"]
    assert kept.base is None and not kept.flags.writeable  # does not keep the batch alive; nobody writes it
    np.testing.assert_array_equal(kept, row)
    batch[2] = -1  # the batch's buffer changing later does not change what the cache answers
    again = cache.lookup(b"k")
    assert again is not None and again["y"][0, 0] == 16.0 and again.parameters == {"label": "cat"}


def test_bytes_outputs_are_sized_by_their_contents():
    cache = ResponseCache(1 << 20)
    cache.insert(b"k", OWNER, {"s": np.array([b"x" * 1000, b"y" * 3000], dtype=object)})
    assert cache.used > 4000


def test_forget_drops_one_versions_entries():
    cache = ResponseCache(1 << 20)
    other = ResponseCache.owner()
    cache.insert(b"mine", OWNER, _outputs(64))
    cache.insert(b"theirs", other, _outputs(64))
    assert cache.forget(OWNER) == 1
    assert cache.lookup(b"mine") is None and cache.lookup(b"theirs") is not None
    assert cache.used == ENTRY_OVERHEAD + 1 + 64


def test_replacing_a_key_counts_its_bytes_once():
    cache = ResponseCache(1 << 20)
    cache.insert(b"k", OWNER, _outputs(64))
    cache.insert(b"k", OWNER, _outputs(128))
    assert cache.entries == 1 and cache.used == ENTRY_OVERHEAD + 1 + 128
