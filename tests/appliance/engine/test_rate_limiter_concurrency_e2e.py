"""The rate limiter end to end under concurrent clients (security finding "High 5"): a daemon started with
--rate-limit execution_count serving two Python models, two instances each, whose instance groups share a
global resource and a per-device one. Many clients at once: every request is answered with its own
output (no "took its resources twice", no HTTP 500), the models still serve afterwards (none hung), and
once idle the metrics show no copy held."""

from __future__ import annotations

import concurrent.futures
import re
import threading
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.models import copy_model
from tests.waiting import wait_until

MODELS = ("detector", "classifier")
CLIENTS = 16
REQUESTS = 400


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("limited-concurrent") / "repo"
    for name in MODELS:
        copy_model(repo, "engine/limited_echo", name, config=name)
    return repo


@pytest.fixture(scope="module")
def daemon(module_daemon, repository):
    return module_daemon(repository, "--rate-limit", "execution_count", "--rate-limit-resource", "bus:1",
                         "--rate-limit-resource", "npu:1")


_clients = threading.local()


def _infer(url: str, model: str, value: float) -> tuple[float, float]:
    """(sent, received); a hung model fails the request after its network timeout rather than the test."""
    client = getattr(_clients, "client", None)
    if client is None:
        client = _clients.client = httpclient.InferenceServerClient(url, connection_timeout=10, network_timeout=10)
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([value], np.float32))
    return value, float(client.infer(model, [tensor]).as_numpy("OUT")[0])


def _in_use(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{url}/metrics", timeout=10).read().decode()
    return {labels: float(value) for labels, value in
            re.findall(r"^appliance_rate_limiter_resource_in_use\{([^}]*)\} (\S+)$", text, re.MULTILINE)}


def test_many_concurrent_clients_are_all_answered_and_nothing_stays_held(daemon):
    pool = concurrent.futures.ThreadPoolExecutor(CLIENTS)
    try:
        futures = [pool.submit(_infer, daemon.url, MODELS[i % len(MODELS)], float(i)) for i in range(REQUESTS)]
        _, unanswered = concurrent.futures.wait(futures, timeout=60)  # a few seconds when nothing hangs
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a hung client ends with the daemon, at teardown
    assert not unanswered, f"{len(unanswered)} of {REQUESTS} requests were never answered (a model hung)"
    failures = [repr(f.exception()) for f in futures if f.exception()]
    assert failures == [], f"{len(failures)} of {REQUESTS} failed: {failures[:3]}"
    assert all(sent == received for sent, received in (f.result() for f in futures))
    assert "took its resources twice" not in daemon.log()
    for model in MODELS:  # both models still serve
        assert _infer(daemon.url, model, 7.0) == (7.0, 7.0)
    wait_until(lambda: not any(_in_use(daemon.url).values()), timeout=10, interval=0.05,
               what="every resource given back")
    assert len(_in_use(daemon.url)) == 2  # bus (global) and npu (device 0), both listed
