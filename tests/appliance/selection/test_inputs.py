"""Tuning inputs: warmup first, then synthetic inputs that honour the config, several sizes for variable dims."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.examples.sequence import accumulator_config, accumulator_model
from appliance.selection.inputs import MAX_SAMPLE_ELEMENTS, InputSearch, tuning_inputs
from tests.appliance.selection.contexts import ONNX, onnx_context
from tests.builders import DENSENET_CONFIG, densenet_like_model, save, vad_like_model


def test_synthetic_inputs_follow_reshape_without_a_batch_dimension(tmp_path):
    model_file = save(densenet_like_model(size=16), tmp_path / "densenet_onnx" / "1" / "model.onnx")
    context = onnx_context(model_file, DENSENET_CONFIG.format(size=16, classes=10))
    (only,) = list(tuning_inputs(context.config, model_file.parent.parent))
    (sample,) = only.samples
    assert only.source == "synthetic" and sample.batch == 1
    assert sample.shapes == {"data_0": [3, 16, 16]}  # what a client sends
    assert sample.inputs["data_0"].shape == (1, 3, 16, 16)  # what the runtime sees
    assert only.profile() == [{"batch": 1, "shapes": {"data_0": [3, 16, 16]}}]


def test_variable_dimensions_get_several_sizes_within_the_element_bound(tmp_path):
    model_file = save(vad_like_model(), tmp_path / "vad" / "1" / "model.onnx")
    context = onnx_context(model_file)
    sets = list(tuning_inputs(context.config, model_file.parent.parent, sizes=(1, 16, 512, 16000)))
    shapes = [s.samples[0].shapes for s in sets]
    # 16000 x 16000 samples would be 256 M elements: not built.
    assert shapes == [{"input": [n, n], "state": [2, n, 128], "sr": []} for n in (1, 16, 512)]
    assert sets[0].samples[0].inputs["sr"].dtype == np.int64


def test_the_top_batch_shrinks_to_the_element_bound(tmp_path):
    config = text_format.Parse('name: "wide" max_batch_size: 1048576 '
                               'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1000 ] } ]', mc.ModelConfig())
    (only,) = list(tuning_inputs(config, tmp_path))
    assert [s.batch for s in only.samples] == [1, MAX_SAMPLE_ELEMENTS // 1000]


def test_warmup_samples_come_first(tmp_path):
    model_file = save(vad_like_model(), tmp_path / "vad" / "1" / "model.onnx")
    context = onnx_context(model_file, """
        model_warmup [ { name: "speech" batch_size: 1 inputs [
          { key: "input" value: { data_type: TYPE_FP32 dims: [ 2, 4000 ] random_data: true } },
          { key: "state" value: { data_type: TYPE_FP32 dims: [ 2, 2, 128 ] zero_data: true } },
          { key: "sr" value: { data_type: TYPE_INT64 dims: [ ] zero_data: true } } ] } ]""")
    first = next(tuning_inputs(context.config, model_file.parent.parent))
    assert first.source == "warmup"
    assert first.profile() == [{"batch": 1, "shapes": {"input": [2, 4000], "state": [2, 2, 128], "sr": []}}]


def test_the_search_keeps_the_first_set_the_model_runs_and_why_the_others_were_refused(tmp_path):
    model_file = save(vad_like_model(pad=64), tmp_path / "vad" / "1" / "model.onnx")
    context = onnx_context(model_file)
    search = InputSearch("vad", tuning_inputs(context.config, model_file.parent.parent, sizes=(1, 16, 512)),
                         ["output", "stateN"])
    backend = ONNX.load(context)
    found = search.find(backend)
    assert found is not None and found.samples[0].shapes["input"] == [512, 512]
    assert [r["inputs"] for r in search.refused] == ["synthetic inputs, variable dimensions 1",
                                                     "synthetic inputs, variable dimensions 16"]
    assert all("Pad" in r["reason"] for r in search.refused)
    assert search.find(backend) is found  # every later plan is measured on the same inputs


def test_a_search_with_nothing_the_model_runs_finds_nothing(tmp_path):
    model_file = save(vad_like_model(pad=64), tmp_path / "vad" / "1" / "model.onnx")
    context = onnx_context(model_file)
    search = InputSearch("vad", tuning_inputs(context.config, model_file.parent.parent, sizes=(1, 16)),
                         ["output", "stateN"])
    assert search.find(ONNX.load(context)) is None
    assert len(search.refused) == 2


@pytest.mark.parametrize("sizes", [(1,), (1, 16, 512, 16000)])
def test_fixed_shapes_give_one_synthetic_set(tmp_path, sizes):
    model_file = save(densenet_like_model(size=8), tmp_path / "d" / "1" / "model.onnx")
    context = onnx_context(model_file, DENSENET_CONFIG.format(size=8, classes=10).replace("densenet_onnx", "d"))
    assert len(list(tuning_inputs(context.config, model_file.parent.parent, sizes=sizes))) == 1


def test_a_sequence_model_is_tuned_with_its_control_and_state_tensors(tmp_path):
    model_file = save(accumulator_model("FP32", "UINT64"), tmp_path / "acc" / "1" / "model.onnx")
    context = onnx_context(model_file, accumulator_config("oldest { }", "FP32", "UINT64", max_batch_size=8))
    assert [entry.name for entry in context.config.input] == ["INPUT"]  # the rest is the batcher's
    search = InputSearch("acc", tuning_inputs(context.config, model_file.parent.parent), ["OUTPUT"])
    found = search.find(ONNX.load(context))
    assert found is not None and not search.refused
    top = found.samples[-1]
    assert top.shapes == {"INPUT": [8, 1]}  # what clients send
    assert top.inputs["START"].tolist() == [[1.0]] * 8 and top.inputs["READY"].dtype == np.float32
    assert top.inputs["CORRID"].reshape(-1).tolist() == list(range(1, 9))
    assert top.inputs["ACC_IN"].shape == (8, 1) and not top.inputs["ACC_IN"].any()
