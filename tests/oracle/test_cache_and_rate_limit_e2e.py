"""The response cache and the rate limiter held to real Triton 2.51: the same repository served by both
(``--cache-config local,size=...`` and ``--rate-limit execution_count``), compared on what a client sees:
the config members Triton shows (``response_cache``, ``model_transaction_policy``, an instance group's
``rate_limiter``), the statistics and /metrics counters after repeated requests, and the refusal of a
decoupled model that enables the cache (the models: tests/models/oracle/). Skipped, with the reason, where
Triton cannot run here."""

from __future__ import annotations

import shutil
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.models import MODELS, copy_model
from tests.oracle import TritonServer
from tests.waiting import wait_until

CACHE = "local,size=1048576"
REFUSAL = ("Response Cache does not currently support model streaming with 'decoupled' transaction policy. "
           "Please disable the response cache.")


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("cache-oracle") / "repo"
    copy_model(repo, "oracle/two_outputs", "cached", config="cached")
    copy_model(repo, "oracle/two_outputs", "plain")
    copy_model(repo, "oracle/cached_decoupled", "streaming")
    (repo / "ens" / "1").mkdir(parents=True)
    shutil.copyfile(MODELS / "oracle" / "cached_ensemble" / "config.pbtxt", repo / "ens" / "config.pbtxt")
    return repo


def _scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def _observe(http_url: str, metrics_url: str) -> dict:
    """What a client sees of both servers: configs, the statistics after three identical requests to the
    cached model and the cached ensemble, their cache counters on /metrics, and the repository index."""
    client = httpclient.InferenceServerClient(http_url)
    seen: dict = {"config": {m: client.get_model_config(m) for m in ("cached", "ens")}}
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    for model, name in (("cached", "INPUT0"), ("ens", "IN")):
        for _ in range(3):
            tensor = httpclient.InferInput(name, [1, 4], "FP32")
            tensor.set_data_from_numpy(x)
            client.infer(model, [tensor])
        # A server may record a request's statistics just after answering it: read them once all 3 are in.
        stats = wait_until(lambda model=model: _settled(client, model, 3), timeout=30,
                           what=f"{model}'s 3 requests counted")
        inference = stats["inference_stats"]
        seen[model] = {"inference_count": stats["inference_count"], "execution_count": stats["execution_count"],
                       **{key: inference[key]["count"] for key in ("success", "queue", "compute_infer",
                                                                    "cache_hit", "cache_miss")}}
    metrics = _scrape(metrics_url)
    seen["metrics"] = {key: value for key, value in metrics.items()
                       if key.startswith(("nv_cache_num_hits_per_model", "nv_cache_num_misses_per_model"))}
    seen["index"] = {row["name"]: row for row in client.get_model_repository_index()}
    return seen


def _settled(client: httpclient.InferenceServerClient, model: str, requests: int) -> dict | None:
    stats = client.get_inference_statistics(model)["model_stats"][0]
    return stats if stats["inference_stats"]["success"]["count"] >= requests else None


@pytest.fixture(scope="module")
def triton(triton_install, repository, tmp_path_factory) -> dict:
    caches = triton_install.server_root / "caches"
    args = [f"--cache-config={CACHE}", f"--cache-directory={caches}", "--rate-limit=execution_count",
            "--exit-on-error=false", "--strict-readiness=false"]
    with TritonServer(repository, args=args, metrics=True, triton=triton_install,
                      log_path=tmp_path_factory.mktemp("triton") / "triton.log") as server:
        assert server.metrics_url is not None
        return {**_observe(server.http_url, server.metrics_url), "log": server.log()}


@pytest.fixture(scope="module")
def appliance(module_daemon, repository) -> dict:
    daemon = module_daemon(repository, "--cache-config", CACHE, "--rate-limit", "execution_count")
    return _observe(daemon.url, daemon.base + "/metrics")


def test_the_config_shows_the_cache_the_transaction_policy_and_the_rate_limiter_as_triton(triton, appliance):
    for model in ("cached", "ens"):
        for member in ("response_cache", "model_transaction_policy"):
            assert appliance["config"][model].get(member) == triton["config"][model].get(member), (model, member)
    assert triton["config"]["ens"]["model_transaction_policy"] == {"decoupled": False}
    assert "model_transaction_policy" not in triton["config"]["cached"]
    limiter = triton["config"]["cached"]["instance_group"][0]["rate_limiter"]
    assert appliance["config"]["cached"]["instance_group"][0]["rate_limiter"] == limiter


def test_hits_and_misses_are_counted_as_triton_counts_them(triton, appliance):
    for model in ("cached", "ens"):
        assert appliance[model] == triton[model], model
    assert triton["cached"]["cache_hit"] == 2 and triton["cached"]["cache_miss"] == 1
    assert appliance["metrics"] == triton["metrics"]


def test_a_decoupled_model_enabling_the_cache_is_refused_in_tritons_words(triton, appliance):
    # Triton fails the config before the model has a version: its index row names the model only, and the
    # reason is in its log; the appliance's row says UNAVAILABLE with the same words.
    assert REFUSAL in triton["log"] and "state" not in triton["index"]["streaming"]
    assert appliance["index"]["streaming"]["state"] == "UNAVAILABLE"
    assert REFUSAL in appliance["index"]["streaming"]["reason"]
