"""model_warmup as Triton runs it: samples built from the config, run `count` times on every instance
before the version is ready; a failing sample fails the load with its reason."""

from __future__ import annotations

import asyncio
import struct

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import RuntimeOptions
from appliance.core.errors import ConfigError
from appliance.repository.loader import load_model
from appliance.repository.warmup import warmup_samples
from tests.builders import framing_model, write_model
from tests.models import copy_model


def _config(text: str) -> mc.ModelConfig:
    config = text_format.Parse(text, mc.ModelConfig())
    config.name = config.name or "m"
    return config


def test_warmup_runs_count_times_on_every_instance_before_the_load_returns(tmp_path):
    model_dir = copy_model(tmp_path, "repository/counting").parent.parent
    (model_dir / "warmup").mkdir()
    (model_dir / "warmup" / "ones.raw").write_bytes(np.ones(4, np.float32).tobytes())
    loaded = load_model(model_dir, RuntimeOptions())
    try:
        lines = sorted((model_dir / "executions.log").read_text().splitlines())
    finally:
        asyncio.run(loaded.versions[1].close())
    # "ones": batch 3, count 2; "zeros": count 0 means once; on each of the 2 instances.
    assert lines == sorted([f"counting_0_{i} [3, 4] 1.0" for i in (0, 1) for _ in range(2)]
                           + [f"counting_0_{i} [1, 4] 0.0" for i in (0, 1)])


def test_a_failing_warmup_fails_the_load_with_the_sample_and_the_reason(tmp_path):
    model_dir = write_model(tmp_path, "frames", framing_model(frame=480), config='''
        max_batch_size: 0
        model_warmup [ { name: "short" batch_size: 1 inputs [ { key: "audio"
          value: { data_type: TYPE_FP32 dims: [ 1, 100 ] zero_data: true } } ] } ]''')
    with pytest.raises(ConfigError) as raised:
        load_model(model_dir, RuntimeOptions())
    message = raised.value.message
    assert "model_warmup sample 'short' failed on instance 0" in message and "onnxruntime refused" in message
    assert "fix the sample in config.pbtxt" in message


def test_samples_follow_triton_semantics(tmp_path):
    (tmp_path / "warmup").mkdir()
    words = [b"hello", b"", b"edge"]
    (tmp_path / "warmup" / "words.bin").write_bytes(b"".join(struct.pack("<I", len(w)) + w for w in words))
    config = _config('''
        max_batch_size: 4
        input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] },
                { name: "s" data_type: TYPE_STRING dims: [ 3 ] },
                { name: "r" data_type: TYPE_STRING dims: [ 2 ] } ]
        model_warmup [ { name: "w" batch_size: 2 inputs [
          { key: "x" value: { data_type: TYPE_FP32 dims: [ 5 ] random_data: true } },
          { key: "s" value: { data_type: TYPE_STRING dims: [ 3 ] input_data_file: "words.bin" } },
          { key: "r" value: { data_type: TYPE_STRING dims: [ 2 ] random_data: true } } ] } ]''')
    (sample,) = warmup_samples(config, tmp_path)
    assert (sample.name, sample.batch, sample.count) == ("w", 2, 1)
    assert sample.inputs["x"].shape == (2, 5) and sample.inputs["x"].dtype == np.float32
    assert np.array_equal(sample.inputs["x"][0], sample.inputs["x"][1])  # one item, duplicated to the batch
    assert sample.inputs["s"].tolist() == [words, words]
    assert sample.inputs["r"].tolist() == [[b"", b""]] * 2  # random strings fall back to zero data


@pytest.mark.parametrize("sample, words", [
    ('batch_size: 9 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }',
     "batch_size must be 1..4"),
    ('batch_size: 1 inputs { key: "y" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }',
     "'y' is not an input of the model"),
    ('batch_size: 1 inputs { key: "x" value: { data_type: TYPE_INT32 dims: [ 4 ] zero_data: true } }',
     "has data_type TYPE_INT32, but the model's input is TYPE_FP32"),
    ('batch_size: 1 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 5 ] zero_data: true } }',
     "do not fit the input's dims [4]"),
    ('batch_size: 1', "gives no data for input(s) ['x']"),
    ('batch_size: 1 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "short.raw" } }',
     "short.raw has 8 bytes; dims [4] of FP32 need 16"),
])
def test_a_sample_that_does_not_fit_the_config_says_what_to_fix(tmp_path, sample, words):
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "short.raw").write_bytes(bytes(8))
    config = _config('max_batch_size: 4 input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ] '
                     f'model_warmup [ {{ name: "bad" {sample} }} ]')
    with pytest.raises(ConfigError, match="model_warmup sample 'bad'") as raised:
        warmup_samples(config, tmp_path)
    assert words in raised.value.message
