"""The Redis response cache end to end: two daemons given the same secret share their hits through one real
redis-server, an entry altered there is answered from the model, and a Redis that stalls or goes away costs
requests nothing but the cache (they are answered, counted)."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from appliance.engine.redis_entry import EntryKeys, encode_entry
from tests.builders import write_cache_repository
from tests.http_util import call
from tests.redis_server import redis_server
from tests.waiting import wait_until

X = np.array([[1, 2, 3, 4, 5, 6]], np.float32)
SECRET = "the fleet's response cache secret, at least 32 characters"


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return write_cache_repository(tmp_path_factory.mktemp("redis-cache") / "repo")


@pytest.fixture(scope="module")
def daemons(module_daemon, repository, redis):
    flags = ("--cache-config", "redis,host=127.0.0.1", "--cache-config", f"redis,port={redis.port}",
             "--cache-config", "redis,socket_timeout=200", "--cache-config", "redis,ttl=600")
    first = module_daemon(repository, *flags, env={"APPLIANCE_CACHE_REDIS_KEY": SECRET})
    return first, first.like()


def _infer(daemon, model: str, x: np.ndarray) -> np.ndarray:
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return httpclient.InferenceServerClient(daemon.url).infer(model, [tensor]).as_numpy("square")


def _counts(daemon, model: str = "cached") -> tuple[int, int, int]:
    statistics = httpclient.InferenceServerClient(daemon.url).get_inference_statistics(model)["model_stats"][0]
    inference = statistics["inference_stats"]
    return inference["cache_hit"]["count"], inference["cache_miss"]["count"], statistics["inference_count"]


def _metric(daemon, name: str) -> float:
    status, _, body = call(daemon.port, "GET", "/metrics")
    assert status == 200
    match = re.search(rf"^{name} (\S+)$", body.decode(), re.M)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def _until(predicate, timeout: float = 10.0) -> None:
    wait_until(predicate, timeout=timeout, interval=0.05)


def test_two_daemons_share_hits_through_one_redis(daemons, redis):
    first, second = daemons
    x = X + 1
    answer = _infer(first, "cached", x)
    np.testing.assert_array_equal(answer, np.square(x))
    _until(lambda: len(redis.keys()) == 1)  # written after the response, in the background
    assert redis.keys()[0].startswith(b"appliance:rc2:")
    assert 0 < redis.client().ttl(redis.keys()[0]) <= 600
    np.testing.assert_array_equal(_infer(second, "cached", x), answer)
    hits, misses, ran = _counts(second)
    assert (hits, misses, ran) == (1, 0, 0)  # the second daemon never ran the model
    over_grpc = grpcclient.InferenceServerClient(second.grpc_url).get_inference_statistics("cached")
    assert over_grpc.model_stats[0].inference_stats.cache_hit.count == 1
    assert _metric(second, "nv_cache_num_hits") == 1
    _infer(first, "uncached", x)
    assert len(redis.keys()) == 1  # a model whose config does not ask for the cache is not cached


def test_an_entry_altered_on_redis_is_answered_from_the_model(daemons, redis):
    first, second = daemons
    x = X + 50
    written = set(redis.keys())
    _infer(first, "cached", x)
    _until(lambda: len(set(redis.keys()) - written) == 1)
    (key,) = set(redis.keys()) - written
    failures = _metric(second, "appliance_response_cache_redis_failures")
    insertions = _metric(second, "appliance_response_cache_insertions")
    outputs = {"double": np.full((1, 6), 1337, np.float32), "square": np.full((1, 6), 1337, np.float32)}
    redis.client().set(key, encode_entry(key, outputs, None, EntryKeys.of(b"not the secret at all, 32 bytes!")))
    np.testing.assert_array_equal(_infer(second, "cached", x), np.square(x))
    # The second daemon writes its own answer back; then, signed with the secret but BYTES where the model's
    # config says FP32: not served either.
    _until(lambda: _metric(second, "appliance_response_cache_insertions") == insertions + 1)
    pwned = {"double": np.array([[b"pwned!"] * 6], object), "square": np.array([[b"pwned!"] * 6], object)}
    redis.client().set(key, encode_entry(key, pwned, None, EntryKeys.of(SECRET.encode(), shared=True)))
    np.testing.assert_array_equal(_infer(second, "cached", x), np.square(x))
    assert _metric(second, "appliance_response_cache_redis_failures") == failures + 2
    assert "refused" in second.log()


def test_a_stalled_then_stopped_redis_costs_requests_nothing(daemons, redis):
    first, _ = daemons
    before = _metric(first, "appliance_response_cache_redis_failures")
    redis.pause()
    try:
        started = time.monotonic()
        for step in range(5):
            x = X + 100 + step
            np.testing.assert_array_equal(_infer(first, "cached", x), np.square(x))
        assert time.monotonic() - started < 5  # one timeout (200 ms), then the back-off skips Redis
    finally:
        redis.resume()
    assert _metric(first, "appliance_response_cache_redis_failures") > before
    assert _metric(first, "appliance_response_cache_redis_skipped") > 0
    assert "requests are served uncached" in first.log()
    hits, misses, _ = _counts(first)
    assert misses >= 5
    redis.stop()
    x = X + 200
    np.testing.assert_array_equal(_infer(first, "cached", x), np.square(x))  # Redis gone: still answered
    status, _, _ = call(first.port, "GET", "/v2/health/ready")
    assert status == 200


def test_a_bad_redis_setting_stops_the_daemon_with_the_fix(start_daemon, repository):
    with pytest.raises(RuntimeError, match="needs its address"):
        start_daemon(repository, "--cache-config", "redis,host=127.0.0.1")


def test_the_password_from_tritons_environment_variable(start_daemon, repository, tmp_path):
    with redis_server(tmp_path, password="s3cret") as locked:
        endpoint = ("--cache-config", "redis,host=127.0.0.1", "--cache-config", f"redis,port={locked.port}")
        daemon = start_daemon(repository, *endpoint, env={"TRITONCACHE_REDIS_PASSWORD": "s3cret"})
        x = X + 300
        for _ in range(2):
            np.testing.assert_array_equal(_infer(daemon, "cached", x), np.square(x))
            _until(lambda: len(locked.keys()) == 1)
        assert _counts(daemon)[:2] == (1, 1)
        assert _metric(daemon, "appliance_response_cache_redis_failures") == 0
        # Refused credentials are a setting to fix, not an outage: the daemon does not start (as Triton).
        with pytest.raises(RuntimeError, match="refused the cache's credentials.*redis,password="):
            start_daemon(repository, *endpoint, env={"TRITONCACHE_REDIS_PASSWORD": "wrong"})


def test_a_daemon_started_while_redis_is_down_serves_uncached(start_daemon, repository, tmp_path):
    with redis_server(tmp_path) as gone:
        port = gone.port
    daemon = start_daemon(repository, "--cache-config", "redis,host=127.0.0.1", "--cache-config", f"redis,port={port}",
                          "--cache-config", "redis,connect_timeout=200")
    x = X + 400
    np.testing.assert_array_equal(_infer(daemon, "cached", x), np.square(x))
    assert _metric(daemon, "appliance_response_cache_redis_failures") >= 1
    assert "requests are served uncached" in daemon.log()
