"""Through a daemon: concurrent requests to a Python model without dynamic batching reach its process in
groups, yet each is its own execute() call and its own execution in the statistics, as under Triton's
default scheduler; one whose execute() raises fails alone, in Triton's words."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.models import copy_model

_COUNT = 12


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("groups")
    copy_model(repo, "backends/one_at_a_time", "one", config="queued")  # concurrent requests queue
    return repo


@pytest.fixture(scope="module")
def daemon(module_in_process, repository):
    return module_in_process(repository)


def _inputs(value: float) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("IN", [2], "FP32")
    tensor.set_data_from_numpy(np.asarray([value, value], np.float32))
    return [tensor]


def test_concurrent_requests_each_run_alone_and_count_as_their_own_execution(daemon):
    with httpclient.InferenceServerClient(daemon.url, concurrency=_COUNT) as client:
        values = [float(i) for i in range(_COUNT)]
        values[5] = -1.0
        pending = [client.async_infer("one", _inputs(v)) for v in values]
        seen = []
        for value, call in zip(values, pending):
            if value == -1.0:
                with pytest.raises(InferenceServerException) as failed:
                    call.get_result()
                assert "Failed to process the request(s) for model 'one_0', message: ValueError: minus one" in str(
                    failed.value)
                continue
            result = call.get_result()
            assert result.as_numpy("OUT").tolist() == [value + 1, value + 1]
            seen.append(result.as_numpy("SEEN").tolist())
        assert all(alone == 1 for alone, _ in seen)  # execute() got one request each time
        assert len({execution for _, execution in seen}) == _COUNT - 1
        stats = client.get_inference_statistics("one")["model_stats"][0]
    assert int(stats["execution_count"]) == _COUNT  # the failed execution counts, as in Triton
    assert int(stats["inference_count"]) == _COUNT - 1
    assert stats["inference_stats"]["fail"]["count"] == 1
    assert stats["inference_stats"]["success"]["count"] == _COUNT - 1
    assert [int(b["batch_size"]) for b in stats["batch_stats"]] == [1]
