"""Triton's identity backend (``backend: "identity"``), as its qa models use it: load checks in Triton's
words, each OUTPUT<i> a copy of INPUT<i>, optional inputs, requests batched together, the delays, the
response parameters and the input_byte_size_counter metric; found by name, loaded from an empty version
directory, and served as its config says (never measured against other runtimes)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import BackendRequest, BackendServices, LoadContext, RuntimeOptions, named, resolve_backend
from appliance.backends.identity import RESPONSE_PARAMETERS
from appliance.core.errors import ConfigError, InvalidInput
from appliance.metrics.custom import CustomMetrics
from appliance.repository.loader import load_model
from appliance.selection import Hardware, Selector
from hardware_probe import ProbeReport

IDENTITY = named("identity")

INT32_PAIR = '''
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
'''

# Three pairs: INT32, BYTES, and an optional FP32 input of dims [-1, 3].
THREE_PAIRS = '''
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "INPUT1" data_type: TYPE_STRING dims: [ -1 ] optional: true },
  { name: "INPUT2" data_type: TYPE_FP32 dims: [ -1, 3 ] optional: true }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "OUTPUT1" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "OUTPUT2" data_type: TYPE_FP32 dims: [ -1, 3 ] }
]
'''


def _parameters(**values: object) -> str:
    return "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in values.items())


def _load(text: str, instance: int = 0, services: BackendServices | None = None, **parameters: object):
    config = text_format.Parse(text + _parameters(**parameters), mc.ModelConfig(name="ident"))
    return IDENTITY.load(LoadContext("ident", 1, Path("/nowhere/ident/1/model"), config, RuntimeOptions(),
                                     instance_index=instance, services=services))


def _request(outputs=("OUTPUT0",), size: int = 1, **inputs: np.ndarray) -> BackendRequest:
    return BackendRequest(inputs, list(outputs), size=size)


def _pair(in_name: str = "INPUT0", out_name: str = "OUTPUT0", in_type: str = "TYPE_INT32",
          out_type: str = "TYPE_INT32", in_dims: str = "[ -1 ]", out_dims: str = "[ -1 ]", extra: str = "") -> str:
    return (f'input [ {{ name: "{in_name}" data_type: {in_type} dims: {in_dims} {extra} }} ]\n'
            f'output [ {{ name: "{out_name}" data_type: {out_type} dims: {out_dims} }} ]\n')


@pytest.mark.parametrize(("text", "words"), [
    ('input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]',
     "model configuration must have equal input/output pairs"),
    (_pair(in_name="IN0"), "expected input name to follow INPUT<index> pattern, got 'IN0'"),
    (_pair(out_name="OUT"), "expected output name to follow OUTPUT<index> pattern, got 'OUT'"),
    (_pair(out_name="OUTPUT1"), "expected input and output indices to match"),
    (_pair(out_type="TYPE_FP32"), "expected input and output datatype to match, got TYPE_INT32 and TYPE_FP32"),
    (_pair(in_dims="[ 2, 3 ]"), "expected input and output shape to match, got [2,3] and [-1]"),
    # The shape the backend sees: a reshape's, not the dims a client sends.
    (_pair(in_dims="[ 6 ]", out_dims="[ 6 ]", extra="reshape: { shape: [ 2, 3 ] }"),
     "expected input and output shape to match, got [2,3] and [6]"),
])
def test_a_config_that_does_not_pair_inputs_with_outputs_fails_the_load_in_tritons_words(text, words):
    with pytest.raises(ConfigError) as caught:
        _load(text)
    assert caught.value.message.startswith(words)
    assert "model 'ident', backend identity:" in caught.value.message  # and then how to fix it


def test_pairs_that_match_through_a_reshape_load():
    _load(_pair(in_dims="[ 6 ]", out_dims="[ 2, 3 ]", extra="reshape: { shape: [ 2, 3 ] }"))


@pytest.mark.parametrize("key", ["execute_delay_ms", "creation_delay_sec", "instance_wise_delay_multiplier"])
@pytest.mark.parametrize("value", ["soon", "-5"])
def test_a_delay_that_is_not_a_whole_number_fails_the_load(key, value):
    extra = {"execute_delay_ms": 1} if key == "instance_wise_delay_multiplier" else {}
    with pytest.raises(ConfigError, match=f"parameter {key} is '{value}'.*a whole number >= 0"):
        _load(INT32_PAIR, **extra, **{key: value})


def test_each_output_is_a_copy_of_its_input_with_tritons_response_parameters():
    backend = _load(THREE_PAIRS)
    numbers = np.array([3, 1, 2], np.int32)
    words = np.array([b"a", b"", b"\xff\x00"], dtype=object)
    (result,) = backend.run_requests([_request(("OUTPUT0", "OUTPUT1"), INPUT0=numbers, INPUT1=words)]).results
    assert isinstance(result, dict) and list(result) == ["OUTPUT0", "OUTPUT1"]
    assert result["OUTPUT0"].dtype == np.int32 and result["OUTPUT0"].tolist() == [3, 1, 2]
    assert result["OUTPUT1"].dtype == object and result["OUTPUT1"].tolist() == [b"a", b"", b"\xff\x00"]
    assert not np.shares_memory(result["OUTPUT0"], numbers)  # never a view of the request's buffer
    assert dict(result.parameters) == dict(RESPONSE_PARAMETERS) == {  # type: ignore[union-attr]
        "param0": "an example string parameter", "param1": 42, "param2": False, "param3": 123.123}


def test_only_the_requested_outputs_are_answered():
    backend = _load(THREE_PAIRS)
    (result,) = backend.run_requests([_request(("OUTPUT1",), INPUT0=np.array([1], np.int32),
                                               INPUT1=np.array([b"x"], dtype=object))]).results
    assert list(result) == ["OUTPUT1"]  # type: ignore[arg-type]


def test_an_optional_input_left_out_gives_zeros_of_the_config_dims_with_minus_one_as_one():
    backend = _load(THREE_PAIRS)
    (result,) = backend.run_requests([_request(("OUTPUT0", "OUTPUT1", "OUTPUT2"),
                                               INPUT0=np.array([7, 8], np.int32))]).results
    assert isinstance(result, dict)
    assert result["OUTPUT1"].shape == (1,) and result["OUTPUT1"].tolist() == [b""]
    assert result["OUTPUT2"].dtype == np.float32 and result["OUTPUT2"].shape == (1, 3)
    assert not result["OUTPUT2"].any()


def test_in_a_batching_model_the_zeros_take_the_requests_batch_dimension():
    backend = _load("max_batch_size: 8\n" + THREE_PAIRS)
    (result,) = backend.run_requests([_request(("OUTPUT2",), size=4,
                                               INPUT0=np.zeros((4, 2), np.int32))]).results
    assert result["OUTPUT2"].shape == (4, 1, 3)  # type: ignore[index]


def test_a_required_input_left_out_fails_that_request_alone():
    backend = _load(THREE_PAIRS)
    good = _request(INPUT0=np.array([5], np.int32))
    bad = _request(("OUTPUT0",), INPUT1=np.array([b"x"], dtype=object))
    first, second = backend.run_requests([good, bad]).results
    assert first["OUTPUT0"].tolist() == [5]  # type: ignore[index]
    assert isinstance(second, InvalidInput) and second.message.startswith("failed to get input 'INPUT0'")


def test_requests_batched_together_each_get_their_own_rows_and_shapes():
    backend = _load("max_batch_size: 8\n" + THREE_PAIRS)
    requests = [_request(("OUTPUT0", "OUTPUT2"), size=1, INPUT0=np.array([[1, 2, 3]], np.int32),
                         INPUT2=np.ones((1, 2, 3), np.float32)),
                _request(("OUTPUT0",), size=2, INPUT0=np.array([[4], [5]], np.int32))]
    first, second = backend.run_requests(requests).results
    assert first["OUTPUT0"].tolist() == [[1, 2, 3]] and first["OUTPUT2"].shape == (1, 2, 3)  # type: ignore[index]
    assert list(second) == ["OUTPUT0"] and second["OUTPUT0"].tolist() == [[4], [5]]  # type: ignore[arg-type,index]


def test_run_copies_too():
    backend = _load(INT32_PAIR)
    assert backend.run({"INPUT0": np.array([9], np.int32)}, ["OUTPUT0"])["OUTPUT0"].tolist() == [9]


def _timed_batch(backend) -> float:
    start = time.monotonic()
    backend.run_requests([_request(INPUT0=np.array([1], np.int32)), _request(INPUT0=np.array([2], np.int32))])
    return time.monotonic() - start


def test_execute_delay_ms_sleeps_once_per_execution_and_keeps_the_batch_off_the_event_loop():
    backend = _load(INT32_PAIR, execute_delay_ms=100)
    assert _timed_batch(backend) >= 0.1
    assert backend.inline_safe is False and "execute_delay_ms" in backend.inline_refusal


def test_the_instance_wise_multiplier_scales_the_delay_by_the_instance_index():
    assert _timed_batch(_load(INT32_PAIR, instance=2, execute_delay_ms=50, instance_wise_delay_multiplier=3)) >= 0.3
    # Without a delay the multiplier does nothing (Triton reads it only beside execute_delay_ms).
    assert _load(INT32_PAIR, instance=2, instance_wise_delay_multiplier=3).inline_safe is None


def test_creation_delay_sec_sleeps_while_the_model_loads_once_not_per_instance():
    start = time.monotonic()
    _load(INT32_PAIR, creation_delay_sec=1)
    assert time.monotonic() - start >= 1
    start = time.monotonic()
    _load(INT32_PAIR, instance=1, creation_delay_sec=1)
    assert time.monotonic() - start < 1


def test_the_input_byte_size_counter_counts_every_input_copied_per_model_and_version():
    metrics = CustomMetrics()
    services = BackendServices(metrics=metrics)
    first, second = _load(THREE_PAIRS, services=services), _load(THREE_PAIRS, 1, services=services)
    first.run_requests([_request(("OUTPUT0", "OUTPUT1"), INPUT0=np.array([1, 2], np.int32),
                                 INPUT1=np.array([b"abc"], dtype=object))])
    second.run_requests([_request(("OUTPUT0", "OUTPUT2"), INPUT0=np.array([3], np.int32))])  # zeros count nothing
    text = metrics.exposition()
    assert "# TYPE input_byte_size_counter counter" in text
    assert 'input_byte_size_counter{model="ident",version="1"} 19' in text  # 8 + (4 + 3) + 4
    first.close()
    second.close()
    assert "input_byte_size_counter" not in metrics.exposition()


def test_found_by_its_backend_name_and_never_by_the_files_of_a_version_directory(tmp_path):
    assert resolve_backend("m", "identity", "", []) is IDENTITY
    (tmp_path / "1").mkdir()
    with pytest.raises(ConfigError, match="cannot tell which backend"):
        resolve_backend("m", "", "", [tmp_path / "1"])  # an empty directory is no identity model


def _identity_repository(tmp_path: Path) -> Path:
    model = tmp_path / "identity_int32"
    (model / "1").mkdir(parents=True)  # nothing in it: the config is the model, as in Triton's qa
    (model / "config.pbtxt").write_text('name: "identity_int32"\nbackend: "identity"\nmax_batch_size: 0\n'
                                        + INT32_PAIR)
    return model


def test_a_model_loads_from_an_empty_version_directory_as_triton_completes_it(tmp_path):
    loaded = load_model(_identity_repository(tmp_path), RuntimeOptions())
    assert loaded.failures == {} and list(loaded.versions) == [1]
    assert loaded.config.backend == "identity" and loaded.config.platform == ""
    assert loaded.config.default_model_filename == ""  # Triton's identity names no file
    assert [g.count for g in loaded.config.instance_group] == [1]


def test_selection_serves_it_as_its_config_says_without_measuring(tmp_path):
    loaded = load_model(_identity_repository(tmp_path), RuntimeOptions())
    hardware = Hardware(ProbeReport(sections={"cpu": {"status": "present"}}), "f" * 16, {}, ())
    context = LoadContext("identity_int32", 1, tmp_path / "identity_int32" / "1" / "model", loaded.config,
                          RuntimeOptions())
    choice = Selector(hardware, None).choose(IDENTITY, context)
    assert not choice.measured and choice.plan.backend == "identity"
    assert [row["plan"] for row in choice.decision["candidates"]] == ["identity"]
    assert choice.decision["candidates"][0]["reason"] == "the only way to run this model here"
