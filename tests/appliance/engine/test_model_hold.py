"""A version's holds (``ModelVersion.hold``/``let_go``, and ``in_use`` made of them): a request holds its
version from lookup to response, so a version being replaced or unloaded drains only once every request
that chose it has let go, whichever way it held it."""

from __future__ import annotations

import asyncio

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import named
from appliance.engine.instances import InstancePool
from appliance.engine.model import ModelVersion
from appliance.engine.scheduler import Scheduler, policy_from_config
from appliance.engine.stats import ModelStats
from appliance.repository.config import signature_of
from tests.fakes import FakeBackend

CONFIG = """
name: "double"
max_batch_size: 4
input [{ name: "x" data_type: TYPE_FP32 dims: [1] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [1] }]
"""


def _version() -> ModelVersion:
    config = text_format.Parse(CONFIG, mc.ModelConfig())
    stats = ModelStats()
    return ModelVersion("double", 1, config, signature_of(config), named("onnxruntime"),
                        Scheduler("double:1", InstancePool("double:1", [FakeBackend()]), policy_from_config(config),
                                  stats), stats)


async def test_holds_and_in_use_count_the_same_and_drain_waits_for_the_last():
    model = _version()
    model.start()
    try:
        assert model.hold() is model and model.users == 1
        with model.in_use() as held:
            assert held is model and model.users == 2
        assert model.users == 1
        draining = asyncio.ensure_future(model.drain(5))
        await asyncio.sleep(0.05)
        assert not draining.done()  # a request still holds the version
        model.let_go()
        assert model.users == 0 and await asyncio.wait_for(draining, 5)
    finally:
        await model.close(5)
