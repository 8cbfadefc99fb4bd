from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.core.errors import ConfigError, InvalidInput
from appliance.engine.scheduler import policy_from_config


def _policy(text: str):
    config = text_format.Parse(text, mc.ModelConfig())
    config.name = "m"
    return policy_from_config(config)


def test_no_dynamic_batching_is_triton_default_scheduler():
    policy = _policy("max_batch_size: 8")
    assert not policy.dynamic and policy.max_batch_size == 8


def test_every_dynamic_batching_field_is_read():
    policy = _policy("""
        max_batch_size: 16
        dynamic_batching {
          preferred_batch_size: [ 8, 4 ]
          max_queue_delay_microseconds: 500
          preserve_ordering: true
          priority_levels: 3
          default_priority_level: 2
          default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 1000
                                 allow_timeout_override: true max_queue_size: 7 }
          priority_queue_policy { key: 1 value: { max_queue_size: 2 } }
        }""")
    assert policy.dynamic and policy.preferred_batch_sizes == (4, 8)
    assert policy.max_queue_delay == pytest.approx(0.0005)
    assert policy.preserve_ordering and policy.priority_levels == 3 and policy.default_priority == 2
    default = policy.queue_policy(1)
    assert default.delay_on_timeout and default.default_timeout == pytest.approx(0.001)
    assert default.allow_timeout_override and default.max_queue_size == 7
    assert policy.queue_policy(0).max_queue_size == 2  # priority 1 = queue index 0
    assert policy.level_of({}) == 1 and policy.level_of({"priority": 3}) == 2
    assert policy.timeout_of(1, {"timeout": 2000}) == pytest.approx(0.002)
    with pytest.raises(InvalidInput):
        policy.level_of({"priority": 4})


@pytest.mark.parametrize("text,message", [
    ("max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 8 ] }", "must lie in 1..max_batch_size"),
    ("max_batch_size: 4 dynamic_batching { priority_levels: 2 default_priority_level: 3 }", "default_priority_level"),
    ("max_batch_size: 4 dynamic_batching { priority_levels: 1 priority_queue_policy { key: 2 value: {} } }",
     "priority_queue_policy for level 2"),
])
def test_inconsistent_configs_fail_the_model(text, message):
    with pytest.raises(ConfigError, match=message):
        _policy(text)
