"""The rate limiter end to end: a daemon started with --rate-limit execution_count serving two Python models
whose instance groups name one accelerator; the models record when each execution starts and ends (the
system's monotonic clock, shared by their processes): no two executions overlap, and priority 1 runs about
twice as often as priority 2. A model that needs more copies than --rate-limit-resource gives fails to load
with Triton's words."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.models import copy_model


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("limited") / "repo"
    for name in ("detector", "classifier", "greedy"):  # tests/models/engine/recorder/<name>.pbtxt
        copy_model(repo, "engine/recorder", name, config=name)
    return repo


@pytest.fixture(scope="module")
def daemon(module_in_process, repository):
    return module_in_process(repository, rate_limit="execution_count", rate_limit_resources=("accelerator:1",))


def _span(url: str, model: str) -> tuple[str, float, float]:
    client = httpclient.InferenceServerClient(url)
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, np.float32))
    start, end = client.infer(model, [tensor]).as_numpy("SPAN")
    return model, float(start), float(end)


def test_two_models_sharing_an_accelerator_never_execute_at_once(daemon):
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        spans = list(pool.map(lambda model: _span(daemon.url, model), ["detector", "classifier"] * 6))
    ordered = sorted(spans, key=lambda span: span[1])
    overlapping = [(a, b) for a, b in zip(ordered, ordered[1:]) if b[1] < a[2]]
    assert overlapping == [], overlapping
    statistics = httpclient.InferenceServerClient(daemon.url).get_inference_statistics("classifier")
    limited = statistics["model_stats"][0]["rate_limiter_stats"]
    assert limited["priority"] == 2 and limited["executions"] >= 6 and limited["waits"] >= 1


def test_priority_one_runs_twice_as_often_as_priority_two_under_saturation(daemon):
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        spans = list(pool.map(lambda model: _span(daemon.url, model), ["detector", "classifier"] * 24))
    # Executions 12 to 30 of 48: both models have requests waiting, and the earlier test's executions (which
    # rank the first model ahead until its count catches up) are behind; the limiter alone picks who runs.
    window = [model for model, _, _ in sorted(spans, key=lambda span: span[1])[12:30]]
    ratio = window.count("detector") / window.count("classifier")
    assert 1.5 <= ratio <= 2.6, window


def test_a_model_needing_more_than_the_server_gives_fails_to_load_in_tritons_words(daemon):
    index = {row["name"]: row for row in httpclient.InferenceServerClient(daemon.url).get_model_repository_index()}
    assert index["greedy"]["state"] == "UNAVAILABLE"
    assert ('Resource count for "accelerator" is limited to 1 which will prevent scheduling of one or more model '
            "instances, the minimum required count is 2") in index["greedy"]["reason"]
    assert index["detector"]["state"] == "READY"
