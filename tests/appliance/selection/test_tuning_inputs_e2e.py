"""Selection never costs a model: reshape honoured, several sizes tried, unmeasurable models served,
model_warmup used for tuning and run before READY, a failing warmup failing the load."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton

from tests.builders import DENSENET_CONFIG, densenet_like_model, framing_model, vad_like_model, write_model
from tests.http_util import call

WARMUP = '''
model_warmup [ {{ name: "{name}" batch_size: 1 inputs [ {{ key: "audio"
  value: {{ data_type: TYPE_FP32 dims: [ 1, {samples} ] {source} }} }} ] }} ]
'''


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "densenet_onnx", densenet_like_model(size=16), config=DENSENET_CONFIG.format(size=16, classes=10))
    write_model(repo, "vad", vad_like_model(pad=64))
    write_model(repo, "frames", framing_model(frame=480))
    warm = write_model(repo, "frames_warm", framing_model(frame=480), config=WARMUP.format(
        name="speech", samples=4800, source='input_data_file: "speech.raw"'))
    (warm / "warmup").mkdir()
    (warm / "warmup" / "speech.raw").write_bytes(np.random.default_rng(2).standard_normal(4800).astype("<f4").tobytes())
    write_model(repo, "broken_warmup", framing_model(frame=480), config=WARMUP.format(
        name="short", samples=100, source="zero_data: true"))
    return repo


@pytest.fixture(scope="module")
def daemon(module_daemon, repository):
    return module_daemon(repository, selection=True, env={"APPLIANCE_TUNE_BUDGET": "0.02"})


def _selection(daemon, model):
    status, _, payload = call(daemon.port, "GET", f"/v2/models/{model}/selection")
    assert status == 200, payload
    return payload


def _reference(model_file, feeds):
    return ort.InferenceSession(str(model_file)).run(None, feeds)[0]


def test_every_model_triton_serves_is_ready_and_a_failing_warmup_says_why(daemon):
    index = {row["name"]: row for row in call(daemon.port, "POST", "/v2/repository/index", {})[2]}
    assert {n: index[n]["state"] for n in ("densenet_onnx", "vad", "frames", "frames_warm")} == dict.fromkeys(
        ("densenet_onnx", "vad", "frames", "frames_warm"), "READY")
    broken = index["broken_warmup"]
    assert broken["state"] == "UNAVAILABLE"
    assert "model_warmup sample 'short' failed" in broken["reason"] and "refused" in broken["reason"]


def test_densenet_config_with_reshape_is_tuned_and_answers_correctly(daemon, repository):
    decision = _selection(daemon, "densenet_onnx")
    assert decision["status"] == "measured" and decision["tuned_on"] == "synthetic"
    assert decision["profile"] == [{"batch": 1, "shapes": {"data_0": [3, 16, 16]}}]
    image = np.random.default_rng(0).standard_normal((3, 16, 16)).astype(np.float32)
    with triton.InferenceServerClient(daemon.url) as client:
        tensor = triton.InferInput("data_0", [3, 16, 16], "FP32")
        tensor.set_data_from_numpy(image)
        logits = client.infer("densenet_onnx", [tensor]).as_numpy("fc6_1")
    expected = _reference(repository / "densenet_onnx" / "1" / "model.onnx", {"data_0": image[None]})
    assert logits.shape == (10,)
    np.testing.assert_allclose(logits, expected.reshape(10), atol=1e-4, rtol=1e-3)


def test_a_model_refusing_small_inputs_is_tuned_on_a_size_it_accepts(daemon):
    decision = _selection(daemon, "vad")
    assert decision["status"] == "measured"
    assert decision["profile"][0]["shapes"]["input"] == [512, 512]
    assert len(decision["inputs_refused"]) == 2


def test_an_unmeasurable_model_is_served_on_its_default_plan_with_one_warning(daemon, repository):
    decision = _selection(daemon, "frames")
    assert decision["status"] == "unmeasured" and decision["chosen"] is None
    assert "no candidate plan could be measured" in decision["reason"] and "model_warmup" in decision["fix"]
    warnings = [line for line in daemon.log().splitlines()
                if "WARNING" in line and "model frames version 1" in line]
    assert len(warnings) == 1 and "To fix: add model_warmup" in warnings[0]
    audio = np.random.default_rng(3).standard_normal((1, 4800)).astype(np.float32)
    with triton.InferenceServerClient(daemon.url) as client:
        tensor = triton.InferInput("audio", [1, 4800], "FP32")
        tensor.set_data_from_numpy(audio)
        energy = client.infer("frames", [tensor]).as_numpy("energy")
    np.testing.assert_allclose(energy, _reference(repository / "frames" / "1" / "model.onnx", {"audio": audio}),
                               rtol=1e-6)


def test_warmup_data_is_used_for_tuning_and_runs_before_ready(daemon):
    decision = _selection(daemon, "frames_warm")
    assert decision["status"] == "measured" and decision["tuned_on"] == "warmup"
    assert decision["profile"] == [{"batch": 1, "shapes": {"audio": [1, 4800]}}]
    log = daemon.log()
    instances = decision["plan"]["instances"]  # the chosen instance count, each warmed up
    warmed = log.index(f"model frames_warm version 1: warmed up with 1 sample(s), 1 run(s) on each of {instances} "
                       "instance(s)")
    assert warmed < log.index("model frames_warm ready")
