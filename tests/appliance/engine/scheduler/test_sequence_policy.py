"""sequence_batching configs: what is refused (with the fix), the policy read from the rest, the control
tensors it feeds and the correlation IDs it accepts."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2 as mc

from appliance.core.errors import ConfigError, InvalidInput
from appliance.engine.model_files import check_config_paths
from appliance.engine.scheduler import sequence_policy
from appliance.engine.scheduler.correlation import sequence_ids
from appliance.engine.scheduler.sequence_policy import Control
from appliance.engine.scheduler.state import control_tensors, padding_inputs, sequence_sample
from appliance.examples.sequence import accumulator_config
from appliance.repository.config import read_config

INPUT = 'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'


def _write(tmp_path, text: str):
    model = tmp_path / "m"
    model.mkdir(exist_ok=True)
    (model / "config.pbtxt").write_text(text)
    return model


@pytest.mark.parametrize("section, words", [
    ('control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START } ] } ]',
     "needs exactly one of fp32_false_true, int32_false_true or bool_false_true"),
    ('control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }, '
     '{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] } ]', "exactly one control"),
    ('control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 1 ] } ] } ]',
     "two values"),
    ('control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ]',
     "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING"),
    ('control_input [ { name: "INPUT" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] } ]',
     "must not be listed in input"),
    ('state [ { input_name: "s" output_name: "t" data_type: TYPE_FP32 } ]', "needs dims"),
    ('state [ { input_name: "s" data_type: TYPE_FP32 dims: [ 2 ] } ]', "needs input_name and output_name"),
    ('direct { minimum_slot_utilization: 2.0 }', "minimum_slot_utilization must lie in 0.0..1.0"),
    ('oldest { preferred_batch_size: [ 16 ] }', "must lie in 1..max_batch_size"),
])
def test_unservable_sections_fail_to_load_with_the_fix(tmp_path, section, words):
    model = _write(tmp_path, f"max_batch_size: 8\nsequence_batching {{ {section} }}\n{INPUT}")
    with pytest.raises(ConfigError, match=words):
        read_config(model)


def _policy(text: str, model_dir=None):
    config = text_format.Parse(text, mc.ModelConfig())
    config.name = "m"
    return sequence_policy(config, model_dir)


def test_policy_defaults_follow_triton():
    direct = _policy(accumulator_config("", max_batch_size=8))
    assert direct.strategy == "direct" and direct.idle_timeout == 1.0 and direct.slots_per_instance == 8
    oldest = _policy(accumulator_config("oldest { max_queue_delay_microseconds: 500 preferred_batch_size: [4, 2] }"))
    assert oldest.strategy == "oldest" and oldest.max_candidate_sequences == 8
    assert oldest.preferred_batch_sizes == (2, 4) and oldest.max_queue_delay == 0.0005
    assert not direct.iterative and not oldest.iterative
    assert _policy(accumulator_config("iterative_sequence: true")).iterative
    assert _policy(accumulator_config("iterative_sequence: true oldest { }")).iterative


def test_initial_state_from_a_file_inside_the_model(tmp_path):
    text = ('max_batch_size: 2 sequence_batching { state [ { input_name: "s" output_name: "t" data_type: TYPE_FP32 '
            'dims: [ -1 ] initial_state { data_type: TYPE_FP32 dims: [ 3 ] data_file: "init.bin" } } ] }')
    model = _write(tmp_path, text)
    (model / "initial_state").mkdir()
    (model / "initial_state" / "init.bin").write_bytes(np.array([1, 2, 3], np.float32).tobytes())
    assert _policy(text, model).states[0].initial.tolist() == [1.0, 2.0, 3.0]
    (model / "initial_state" / "init.bin").write_bytes(b"\0" * 8)
    with pytest.raises(ConfigError, match="holds 8 bytes; dims \\[3\\] of FP32 need 12"):
        _policy(text, model)


def test_initial_state_files_outside_the_model_are_refused(tmp_path):
    (tmp_path / "secret").write_bytes(b"\0" * 4)
    text = ('max_batch_size: 2 sequence_batching { state [ { input_name: "s" output_name: "t" data_type: TYPE_FP32 '
            'dims: [ 1 ] initial_state { data_type: TYPE_FP32 dims: [ 1 ] data_file: "../../secret" } } ] }')
    model = _write(tmp_path, text)
    with pytest.raises(ConfigError, match="resolves outside the model's directory"):
        check_config_paths(read_config(model), model, [])
    with pytest.raises(ConfigError, match="resolves outside the model's directory"):
        _policy(text, model)


@pytest.mark.parametrize("form, datatype, values", [
    ("fp32_false_true: [ 0, 1 ]", np.float32, (0.0, 1.0)),
    ("int32_false_true: [ 5, 7 ]", np.int32, (5, 7)),
    ("bool_false_true: [ false, true ]", np.bool_, (False, True)),
])
def test_control_tensors_in_every_form(form, datatype, values):
    policy = _policy(f'max_batch_size: 4 sequence_batching {{ control_input [ '
                     f'{{ name: "S" control [ {{ kind: CONTROL_SEQUENCE_START {form} }} ] }}, '
                     f'{{ name: "E" control [ {{ kind: CONTROL_SEQUENCE_END {form} }} ] }}, '
                     f'{{ name: "R" control [ {{ kind: CONTROL_SEQUENCE_READY {form} }} ] }}, '
                     f'{{ name: "C" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT64 }} ] }} ] }}')
    start = control_tensors(policy, flags=1, corrid=42)
    assert {n: (a.dtype, a.shape) for n, a in start.items() if n != "C"} == {
        n: (np.dtype(datatype), (1, 1)) for n in "SER"}
    assert [start[n].item() for n in "SER"] == [values[1], values[0], values[1]]
    assert start["C"].dtype == np.int64 and start["C"].item() == 42
    empty = padding_inputs({"INPUT": np.ones((1, 3), np.float32), **start}, policy)
    assert [empty[n].item() for n in "SER"] == [values[0]] * 3 and empty["C"].item() == 0
    assert not empty["INPUT"].any()
    sample = sequence_sample(policy, 3)
    assert sample["C"].reshape(-1).tolist() == [1, 2, 3] and sample["S"].shape == (3, 1)
    for name in "SER":  # each request's own array: what one step's model does to it, the next never sees
        start[name][...] = values[0]
    again = control_tensors(policy, flags=1, corrid=42)
    assert [again[n].item() for n in "SER"] == [values[1], values[0], values[1]]
    assert all(again[n] is not start[n] for n in "SER")


def test_string_corrid_tensors_hold_bytes():
    policy = _policy('max_batch_size: 2 sequence_batching { control_input [ '
                     '{ name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] } ] }')
    assert control_tensors(policy, 0, "abc")["C"].tolist() == [[b"abc"]]
    assert padding_inputs(control_tensors(policy, 0, "abc"), policy)["C"].tolist() == [[b""]]


@pytest.mark.parametrize("parameters, control, expected", [
    ({"sequence_id": 7, "sequence_start": True}, None, (7, 1)),
    ({"sequence_id": "a-b", "sequence_end": True}, None, ("a-b", 2)),
    ({"sequence_id": 2**64 - 1, "sequence_start": True, "sequence_end": True}, Control("C", "corrid", "UINT64"),
     (2**64 - 1, 3)),
    ({"sequence_id": "x"}, Control("C", "corrid", "BYTES"), ("x", 0)),
])
def test_correlation_ids_accepted(parameters, control, expected):
    ids = sequence_ids(parameters, "m", control)
    assert (ids.corrid, ids.flags) == expected


@pytest.mark.parametrize("parameters, control, words", [
    ({}, None, "^inference request to model 'm' must specify a non-zero or non-empty correlation ID"),
    ({"sequence_id": ""}, None, "non-zero or non-empty correlation ID"),
    ({"sequence_id": -1}, None, "outside the uint64 range"),
    ({"sequence_id": 1.5}, None, "must be an unsigned integer or a string"),
    ({"sequence_id": True}, None, "must be an unsigned integer or a string"),
    ({"sequence_id": "x" * 300}, None, "longer than 256 bytes"),
    ({"sequence_id": 3, "sequence_end": 1}, None, "'sequence_end' must be a boolean"),
    ({"sequence_id": 3}, Control("CORRID", "corrid", "BYTES"),
     "^sequence batching control 'CORRID' data-type is 'UINT64', but model 'm' expects 'BYTES'"),
    ({"sequence_id": 2**31}, Control("CORRID", "corrid", "INT32"), "does not fit model 'm''s INT32 control"),
])
def test_correlation_ids_refused(parameters, control, words):
    with pytest.raises(InvalidInput, match=words):
        sequence_ids(parameters, "m", control)


def test_a_string_id_for_a_numeric_corrid_is_taken_as_triton_takes_it():
    """Triton 2.51 accepts it and fills CORRID with the ID's first bytes as a BYTES element (its 4-byte
    length, then its text), read as the control's number (tests/oracle checked INT32 and UINT64)."""
    from appliance.engine.scheduler.state import _string_id_as_number

    assert sequence_ids({"sequence_id": "walk"}, "m", Control("CORRID", "corrid", "UINT64")).corrid == "walk"
    assert _string_id_as_number("walk", "UINT64") == 7740669023272042500
    assert _string_id_as_number("12", "UINT64") == 55186034786306
    assert _string_id_as_number("walk", "INT32") == 4


_FLAG_VALUES = st.none() | st.booleans() | st.integers(-1, 2) | st.text(max_size=3) | st.floats(0, 1)


@given(corrid=st.integers(1, 2**64 - 1) | st.text(min_size=1, max_size=8), start=_FLAG_VALUES, end=_FLAG_VALUES,
       sent_keys=st.sets(st.sampled_from(("sequence_start", "sequence_end"))))
def test_the_flags_are_read_only_from_booleans(corrid, start, end, sent_keys):
    """Whatever a client sends as sequence_start and sequence_end: a boolean sets its flag (absent: false),
    anything else is refused in words that name the parameter."""
    parameters = {"sequence_id": corrid, **{key: value for key, value in
                                            (("sequence_start", start), ("sequence_end", end)) if key in sent_keys}}
    sent = {key: parameters.get(key, False) for key in ("sequence_start", "sequence_end")}
    wrong = [key for key, value in sent.items() if type(value) is not bool]
    if wrong:
        with pytest.raises(InvalidInput, match=f"'{wrong[0]}' must be a boolean"):
            sequence_ids(parameters, "m", None)
        return
    ids = sequence_ids(parameters, "m", None)
    assert (ids.corrid, ids.start, ids.end) == (corrid, sent["sequence_start"], sent["sequence_end"])
