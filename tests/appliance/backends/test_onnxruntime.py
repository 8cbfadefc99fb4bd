from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import LoadContext, RuntimeOptions, named
from appliance.backends.onnxruntime import SPINNING, _v2_datatype
from appliance.core.errors import ConfigError, InvalidInput
from appliance.examples import build_example_repository


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    return build_example_repository(tmp_path_factory.mktemp("x") / "repo")


def _load(path):
    info = named("onnxruntime")
    return info.load(LoadContext("m", 1, path, mc.ModelConfig(), RuntimeOptions()))


def test_describes_tensors_with_dynamic_dimensions(example):
    backend = _load(example / "simple_string" / "1" / "model.onnx")
    assert [(t.name, t.datatype, t.shape) for t in backend.inputs()] == [
        ("INPUT0", "BYTES", (-1, 16)), ("INPUT1", "BYTES", (-1, 16))]


def test_bytes_in_bytes_out(example):
    backend = _load(example / "simple_string" / "1" / "model.onnx")
    a = np.array([[str(i).encode() for i in range(16)]], dtype=object)
    result = backend.run({"INPUT0": a, "INPUT1": a}, ["OUTPUT0"])
    assert list(result) == ["OUTPUT0"]
    assert result["OUTPUT0"][0, 3] == b"6"


def test_non_utf8_bytes_are_invalid_input(example):
    backend = _load(example / "simple_string" / "1" / "model.onnx")
    a = np.array([[b"\xff"] * 16], dtype=object)
    with pytest.raises(InvalidInput, match="not UTF-8"):
        backend.run({"INPUT0": a, "INPUT1": a}, ["OUTPUT0"])


def test_text_that_is_not_a_number_for_a_graph_that_parses_numbers_is_invalid_input(example):
    """Issue 22 (Low): non-numeric BYTES to simple_string (which casts its strings to INT32) was INTERNAL."""
    backend = _load(example / "simple_string" / "1" / "model.onnx")
    a = np.array([[b"abc"] * 16], dtype=object)
    with pytest.raises(InvalidInput, match="could not read a BYTES input as a number"):
        backend.run({"INPUT0": a, "INPUT1": a}, ["OUTPUT0"])


def test_the_intra_op_pool_blocks_instead_of_spinning(example):
    """A spinning pool holds a core after every run (bench.peers: twice the CPU a CNN request)."""
    backend = _load(example / "simple_string" / "1" / "model.onnx")
    assert backend._session.get_session_options().get_session_config_entry(SPINNING) == "0"


def test_unloadable_file_is_a_config_error(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x00garbage")
    with pytest.raises(ConfigError, match="onnxruntime cannot load"):
        _load(path)



@pytest.mark.parametrize(("ort_type", "datatype"), [
    ("tensor(bool)", "BOOL"), ("tensor(uint8)", "UINT8"), ("tensor(uint64)", "UINT64"), ("tensor(int8)", "INT8"),
    ("tensor(int64)", "INT64"), ("tensor(float16)", "FP16"), ("tensor(float)", "FP32"), ("tensor(double)", "FP64"),
    ("tensor(string)", "BYTES"), ("tensor(bfloat16)", "BF16"),
    # No v2 datatype: the model is refused at load, naming the tensor.
    ("tensor(uint4)", None), ("tensor(float8e4m3fn)", None), ("tensor(complex64)", None),
    ("seq(tensor(float))", None), ("map(int64,tensor(float))", None),
])
def test_onnxruntime_types_map_to_triton_datatypes(ort_type, datatype):
    assert _v2_datatype(ort_type) == datatype
