from __future__ import annotations

import json

import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.core.errors import ConfigError
from appliance.core.tensors import RuntimeTensor
from appliance.repository.config import (
    check_decoupled,
    complete_config,
    config_from_json,
    config_to_json,
    read_config,
    select_versions,
    signature_of,
)


def _config(text: str, name: str = "m") -> mc.ModelConfig:
    config = text_format.Parse(text, mc.ModelConfig())
    config.name = name
    return config


def _complete(config, inputs, outputs):
    return complete_config(config, platform="onnxruntime_onnx", backend="onnxruntime",
                           default_filename="model.onnx", inputs=inputs, outputs=outputs)


BATCHED_IN = [RuntimeTensor("x", "FP32", (-1, 3, 8))]
BATCHED_OUT = [RuntimeTensor("y", "INT64", (-1, 2))]


def test_read_config_parses_triton_text_format(tmp_path):
    (tmp_path / "resnet").mkdir()
    (tmp_path / "resnet" / "config.pbtxt").write_text(
        'name: "resnet"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 16\n'
        'dynamic_batching { preferred_batch_size: [4, 8] max_queue_delay_microseconds: 100 }\n'
        'instance_group [ { count: 2 kind: KIND_CPU } ]\n'
    )
    config = read_config(tmp_path / "resnet")
    assert config.max_batch_size == 16
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]
    assert config.instance_group[0].count == 2


def test_read_config_rejects_mismatched_name_and_bad_syntax(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.pbtxt").write_text('name: "b"\n')
    with pytest.raises(ConfigError, match="differs from the model directory"):
        read_config(tmp_path / "a")
    (tmp_path / "a" / "config.pbtxt").write_text("max_batch_size: {")
    with pytest.raises(ConfigError, match="not a valid Triton model configuration"):
        read_config(tmp_path / "a")


def test_missing_config_is_empty_with_directory_name(tmp_path):
    (tmp_path / "m").mkdir()
    assert read_config(tmp_path / "m").name == "m"


@pytest.mark.parametrize("policy,available,expected", [
    ("", [1, 2, 3], [3]),
    ("version_policy: { latest { num_versions: 2 } }", [1, 3, 2], [2, 3]),
    ("version_policy: { all { } }", [1, 2, 3], [1, 2, 3]),
    ("version_policy: { specific { versions: [1, 3] } }", [1, 2, 3], [1, 3]),
])
def test_version_policy(policy, available, expected):
    assert select_versions(_config(policy), available) == expected


def test_specific_version_missing_is_an_error():
    with pytest.raises(ConfigError, match=r"asks for version\(s\) \[4\]"):
        select_versions(_config("version_policy: { specific { versions: [4] } }"), [1])


def test_auto_complete_from_runtime_batches_when_every_tensor_can():
    config = _complete(_config(""), BATCHED_IN, BATCHED_OUT)
    assert config.max_batch_size == 4
    assert config.HasField("dynamic_batching")
    assert list(config.input[0].dims) == [3, 8]
    assert mc.DataType.Name(config.output[0].data_type) == "TYPE_INT64"
    assert config.default_model_filename == "model.onnx"
    assert config.version_policy.latest.num_versions == 1
    assert config.instance_group[0].count == 1


def test_auto_complete_keeps_full_shape_when_a_dimension_is_fixed():
    config = _complete(_config(""), [RuntimeTensor("x", "FP32", (1, 3))], BATCHED_OUT)
    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [1, 3]
    assert not config.HasField("dynamic_batching")


def test_partial_config_is_filled_in_and_checked():
    config = _complete(_config('max_batch_size: 8\ninput [ { name: "x" dims: [3, 8] } ]'), BATCHED_IN, BATCHED_OUT)
    assert config.max_batch_size == 8
    assert mc.DataType.Name(config.input[0].data_type) == "TYPE_FP32"
    assert [o.name for o in config.output] == ["y"]
    assert not config.HasField("dynamic_batching")  # an explicit config keeps Triton's default scheduler


@pytest.mark.parametrize("text,message", [
    ('input [ { name: "z" data_type: TYPE_FP32 dims: [3, 8] } ]', "config input 'z' is not in the model"),
    ('max_batch_size: 2\ninput [ { name: "x" data_type: TYPE_INT8 dims: [3, 8] } ]', "data_type TYPE_INT8"),
    ('max_batch_size: 2\ninput [ { name: "x" data_type: TYPE_FP32 dims: [-1, 3, 8] } ]', "leave out the batch"),
])
def test_config_that_contradicts_the_model(text, message):
    with pytest.raises(ConfigError, match=message):
        _complete(_config(text), BATCHED_IN, BATCHED_OUT)


def test_config_json_is_snake_case_with_numbers():
    config = _complete(_config(""), BATCHED_IN, BATCHED_OUT)
    document = config_to_json(config)
    assert document["input"][0]["dims"] == [3, 8]
    assert document["input"][0]["data_type"] == "TYPE_FP32"
    assert document["max_batch_size"] == 4
    assert document["instance_group"][0]["kind"] == "KIND_CPU"
    assert "sequence_batching" not in document


def test_signature_of_config():
    signature = signature_of(_complete(_config(""), BATCHED_IN, BATCHED_OUT))
    assert signature.batched
    assert signature.inputs["x"].dims == (3, 8)
    assert signature.full_shape(signature.outputs["y"]) == [-1, 2]


@pytest.mark.parametrize("text, words", [
    ("max_batch_size: -3", "max_batch_size"),
    ('input [ { name: "x" data_type: TYPE_FP32 dims: [ -5 ] } ]', "dims"),
    ("instance_group [ { count: 100000 } ]", "instances"),
    ("dynamic_batching { preferred_batch_size: [ 0 ] }", "preferred_batch_size"),
])
def test_file_and_override_configs_pass_the_same_checks(tmp_path, text, words):
    from google.protobuf import json_format

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text(text)
    with pytest.raises(ConfigError, match=words):
        read_config(tmp_path / "m")
    as_json = json_format.MessageToDict(text_format.Parse(text, mc.ModelConfig()), preserving_proto_field_name=True)
    with pytest.raises(ConfigError, match=words):
        config_from_json(json.dumps(as_json), "m")


def test_override_json_is_depth_and_type_checked():
    for raw in ("[" * 50_000 + "]" * 50_000, "[]", "1", '{"max_batch_size": "x"}', b"\xff"):
        with pytest.raises(ConfigError, match="parameters.config"):
            config_from_json(raw, "m")
    assert config_from_json('{"max_batch_size": 4}', "m").max_batch_size == 4
    assert config_from_json({"max_batch_size": 4}, "m").name == "m"


def test_config_pbtxt_is_read_with_a_bound(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text("# " + "x" * (5 << 20))
    with pytest.raises(ConfigError, match="more than the"):
        read_config(tmp_path / "m")


def test_iterative_sequence_configs_load(tmp_path):
    text = "sequence_batching { iterative_sequence: true }"
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text(text)
    assert read_config(tmp_path / "m").sequence_batching.iterative_sequence
    document = json_format.MessageToDict(text_format.Parse(text, mc.ModelConfig()), preserving_proto_field_name=True)
    assert config_from_json(json.dumps(document), "m").sequence_batching.iterative_sequence


def test_decoupled_configs_load_for_backends_that_send_many_responses(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text('backend: "python" model_transaction_policy { decoupled: true }')
    config = read_config(tmp_path / "m")
    assert config.model_transaction_policy.decoupled
    check_decoupled(config, "python", True)
    with pytest.raises(ConfigError, match="the onnxruntime backend cannot serve decoupled models.*drop the policy"):
        check_decoupled(config, "onnxruntime", False)
    check_decoupled(mc.ModelConfig(name="m"), "onnxruntime", False)  # not decoupled: nothing to refuse
    sequence = text_format.Parse("model_transaction_policy { decoupled: true } sequence_batching {}", mc.ModelConfig())
    check_decoupled(sequence, "python", True)  # a decoupled sequence model: each step streams its responses
    stateful = text_format.Parse('model_transaction_policy { decoupled: true } sequence_batching { state [ { '
                                 'input_name: "s" output_name: "t" data_type: TYPE_FP32 dims: [ 1 ] } ] }',
                                 mc.ModelConfig())
    with pytest.raises(ConfigError, match="implicit state .* a decoupled model sends its outputs as responses"):
        check_decoupled(stateful, "python", True)


def test_reported_config_has_tritons_auto_filled_preferred_batch_size():
    from appliance.repository.config import as_reported

    config = mc.ModelConfig(name="m", max_batch_size=8)
    config.dynamic_batching.SetInParent()
    reported = as_reported(config)
    assert list(reported.dynamic_batching.preferred_batch_size) == [8]
    assert list(config.dynamic_batching.preferred_batch_size) == []  # the serving config is left alone
    config.dynamic_batching.preferred_batch_size.append(4)
    assert as_reported(config) is config


def test_the_response_cache_is_refused_for_sequence_and_decoupled_models_in_tritons_words(tmp_path):
    (tmp_path / "stateful").mkdir()
    (tmp_path / "stateful" / "config.pbtxt").write_text("sequence_batching {} response_cache { enable: true }")
    with pytest.raises(ConfigError, match="Response Cache does not currently support model stateful with sequence "
                                          "batching scheduler. Please disable the response cache."):
        read_config(tmp_path / "stateful")
    streaming = _config("model_transaction_policy { decoupled: true } response_cache { enable: true }", "streaming")
    with pytest.raises(ConfigError, match="Response Cache does not currently support model streaming with "
                                          "'decoupled' transaction policy. Please disable the response cache."):
        check_decoupled(streaming, "python", True)
    check_decoupled(_config("response_cache { enable: true }"), "onnxruntime", False)  # an ordinary model caches
