"""A model version answering from the response cache: what a hit skips, what it must still do per request
(its outputs, classification, id), what must miss, and what is counted (Triton's cache_hit/cache_miss)."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import named
from appliance.core.errors import InferenceFailed
from appliance.engine.instances import InstancePool
from appliance.engine.model import ModelVersion
from appliance.engine.response_cache import ResponseCache
from appliance.engine.scheduler import Scheduler, policy_from_config
from appliance.engine.stats import ModelStats
from appliance.engine.types import InferInput, InferRequest, RequestedOutput
from appliance.repository.config import signature_of
from tests.fakes import FakeBackend

CONFIG = """
name: "double"
max_batch_size: 4
input [{ name: "x" data_type: TYPE_FP32 dims: [3] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [3] }, { name: "z" data_type: TYPE_FP32 dims: [3] }]
response_cache { enable: true }
"""


@pytest.fixture
async def make_model():
    made: list[ModelVersion] = []

    def make(backend: FakeBackend | None = None, cache: ResponseCache | None = None,
             config_text: str = CONFIG) -> ModelVersion:
        config = text_format.Parse(config_text, mc.ModelConfig())
        stats = ModelStats()
        scheduler = Scheduler("double:1", InstancePool("double:1", [backend or FakeBackend()]),
                              policy_from_config(config), stats)
        model = ModelVersion("double", 1, config, signature_of(config), named("onnxruntime"), scheduler, stats,
                             labels={"y": ["zero", "one", "two", "three", "four", "five"]},
                             response_cache=cache if cache is not None else ResponseCache(1 << 20))
        model.start()
        made.append(model)
        return model

    yield make
    for model in made:
        await model.close(10)


def _request(*values: float, outputs=(), request_id: str = "r", **parameters) -> InferRequest:
    return InferRequest([InferInput("x", "FP32", np.array([values], np.float32))],
                        [RequestedOutput(name, dict(p)) for name, p in outputs], request_id, dict(parameters))


async def test_a_repeated_request_is_answered_from_the_cache_without_running(make_model):
    backend = FakeBackend()
    model = make_model(backend)
    first = await model.infer(_request(1, 2, 3))
    again = await model.infer(_request(1, 2, 3, request_id="again"))
    assert len(backend.batches) == 1  # the second never reached the model
    assert again.id == "again"  # the cached outputs, this request's own id
    assert [o.name for o in again.outputs] == ["y", "z"]
    np.testing.assert_array_equal(again.outputs[0].data, first.outputs[0].data)
    stats = model.stats.as_json()["inference_stats"]
    assert stats["cache_hit"]["count"] == 1 and stats["cache_miss"]["count"] == 1
    assert stats["success"]["count"] == 2 and stats["compute_infer"]["count"] == 1
    assert stats["cache_hit"]["ns"] > 0 and stats["cache_miss"]["ns"] > 0
    assert model.stats.as_json()["execution_count"] == 1 and model.stats.as_json()["inference_count"] == 1


async def test_a_request_for_other_outputs_is_not_answered_with_the_cached_ones(make_model):
    backend = FakeBackend()
    model = make_model(backend)
    await model.infer(_request(1, 2, 3, outputs=[("y", {})]))
    only_z = await model.infer(_request(1, 2, 3, outputs=[("z", {})]))
    assert [o.name for o in only_z.outputs] == ["z"]  # Triton would answer with y as well
    both = await model.infer(_request(1, 2, 3))
    assert [o.name for o in both.outputs] == ["y", "z"]
    assert len(backend.batches) == 3
    assert (await model.infer(_request(1, 2, 3, outputs=[("z", {})]))).outputs[0].name == "z"
    assert len(backend.batches) == 3


async def test_classification_is_applied_to_a_cached_response_per_request(make_model):
    backend = FakeBackend()
    model = make_model(backend)
    raw = await model.infer(_request(0.5, 2, 1, outputs=[("y", {})]))
    top = await model.infer(_request(0.5, 2, 1, outputs=[("y", {"classification": 2})]))
    assert len(backend.batches) == 1  # the same model output, post-processed differently
    assert raw.outputs[0].datatype == "FP32"
    assert list(top.outputs[0].data[0]) == [b"4.000000:1:one", b"2.000000:2:two"]


async def test_parameters_the_model_reads_are_in_the_key_and_scheduling_ones_are_not(make_model):
    backend = FakeBackend()
    model = make_model(backend)
    await model.infer(_request(1, 1, 1))
    await model.infer(_request(1, 1, 1, priority=1, timeout=5_000_000, binary_data_output=True))
    assert len(backend.batches) == 1
    await model.infer(_request(1, 1, 1, threshold=0.25))  # a Python model could answer differently
    await model.infer(_request(1, 1, 1, threshold=0.75))
    assert len(backend.batches) == 3


async def test_a_failed_request_is_not_cached(make_model):
    backend = FakeBackend(fail="broken")
    model = make_model(backend)
    for _ in range(2):
        with pytest.raises(InferenceFailed):
            await model.infer(_request(1, 2, 3))
    assert len(backend.batches) == 2
    assert model.stats.cache_miss.count == 0 and model.stats.cache_hit.count == 0


async def test_a_model_without_response_cache_enabled_is_never_cached(make_model):
    backend = FakeBackend()
    model = make_model(backend, config_text=CONFIG.replace("response_cache { enable: true }", ""))
    assert model.response_cache is None
    for _ in range(2):
        await model.infer(_request(1, 2, 3))
    assert len(backend.batches) == 2
    assert model.stats.as_json()["inference_stats"]["cache_miss"] == {"count": 0, "ns": 0}


async def test_the_cache_is_shared_but_keyed_per_loaded_version(make_model):
    cache = ResponseCache(1 << 20)
    first, second = FakeBackend(), FakeBackend()
    old = make_model(first, cache)
    new = make_model(second, cache)  # the same model and version number, reloaded
    await old.infer(_request(1, 2, 3))
    await new.infer(_request(1, 2, 3))
    assert len(first.batches) == len(second.batches) == 1  # a reload never answers from the old files
    await old.close(10)
    assert cache.entries == 1  # the closed version's entries went with it
