"""The pb_utils surface that needs no server: types, tensors and DLPack, the auto-complete config."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from appliance.backends.python.model_process import triton_python_backend_utils as pb_utils


@pytest.mark.parametrize("dtype,code", [
    (np.bool_, 1), (np.uint8, 2), (np.uint16, 3), (np.uint32, 4), (np.uint64, 5), (np.int8, 6), (np.int16, 7),
    (np.int32, 8), (np.int64, 9), (np.float16, 10), (np.float32, 11), (np.float64, 12), (np.object_, 13),
    (np.bytes_, 13),
])
def test_type_codes_are_tritons(dtype, code):
    assert pb_utils.numpy_to_triton_type(dtype) == code
    if dtype is not np.bytes_:
        assert pb_utils.triton_to_numpy_type(code) == dtype


def test_config_strings_map_to_numpy_types():
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_BOOL") is bool
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.triton_to_numpy_type(99) is None


def test_bytes_tensors_serialize_as_triton_does():
    tensor = np.array([b"ab", "c", b""], dtype=object)
    raw = pb_utils.serialize_byte_tensor(tensor)
    assert raw == b"\x02\x00\x00\x00ab\x01\x00\x00\x00c\x00\x00\x00\x00"
    assert pb_utils.deserialize_bytes_tensor(raw).tolist() == [b"ab", b"c", b""]
    assert pb_utils.serialize_byte_tensor(np.array([], dtype=object)) == ()


def test_tensors_round_trip_through_dlpack_and_torch():
    torch = pytest.importorskip("torch")
    tensor = pb_utils.Tensor("x", np.arange(6, dtype=np.float32).reshape(2, 3))
    assert tensor.triton_dtype() == 11 and tensor.shape() == [2, 3] and tensor.is_cpu()
    shared = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
    assert shared.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert torch.from_dlpack(tensor).sum().item() == 15  # __dlpack__ protocol
    back = pb_utils.Tensor.from_dlpack("y", torch.utils.dlpack.to_dlpack(torch.ones(2, 2)))  # a PyCapsule
    assert back.as_numpy().tolist() == [[1, 1], [1, 1]] and back.name() == "y"
    assert pb_utils.Tensor.from_dlpack("z", torch.full((3,), 7.0)).as_numpy().tolist() == [7, 7, 7]


def test_bf16_tensors_stay_bf16_through_dlpack():
    torch = pytest.importorskip("torch")
    source = torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16)
    tensor = pb_utils.Tensor.from_dlpack("b", source)
    assert tensor.triton_dtype() == 14
    with pytest.raises(pb_utils.TritonModelException, match="^Tensor dtype is BF16 and cannot be converted to NumPy"):
        tensor.as_numpy()
    assert torch.utils.dlpack.from_dlpack(tensor.to_dlpack()).tolist() == [1.5, -2.0, 3.25]
    from_capsule = pb_utils.Tensor.from_dlpack("c", torch.utils.dlpack.to_dlpack(source))
    assert from_capsule.triton_dtype() == 14
    # What goes to the server is the server's BF16 array (ml_dtypes.bfloat16), the same memory as torch's.
    raw = tensor.raw()
    assert raw.dtype == ml_dtypes.bfloat16 and raw.tolist() == [1.5, -2.0, 3.25]
    source[0] = 4.0
    assert tensor.raw()[0] == 4.0


def test_bf16_tensors_from_the_server_and_from_words():
    torch = pytest.importorskip("torch")
    arrived = pb_utils.Tensor("x", np.array([[0.5, 8.0]], dtype=ml_dtypes.bfloat16))  # as an arena hands it over
    assert arrived.triton_dtype() == 14 and arrived.shape() == [1, 2]
    assert torch.from_dlpack(arrived).tolist() == [[0.5, 8.0]]
    words = np.array([0x3FC0, 0xC000], np.uint16)  # 1.5, -2.0
    assert pb_utils.Tensor("w", words, bf16=True).raw().tolist() == [1.5, -2.0]
    with pytest.raises(pb_utils.TritonModelException, match="16-bit words"):
        pb_utils.Tensor("f", np.ones(2, np.float32), bf16=True)


def test_strings_become_bytes_tensors():
    tensor = pb_utils.Tensor("s", np.array(["hé", "x"]))
    assert tensor.as_numpy().tolist() == ["hé".encode(), b"x"] and tensor.triton_dtype() == 13


def _config(**extra):
    return {"name": "m", "max_batch_size": 0, "input": [], "output": [], **extra}


def test_auto_complete_merges_compatible_declarations():
    config = pb_utils.ModelConfig(json.dumps(_config(input=[{"name": "a", "data_type": "TYPE_FP32", "dims": []}])))
    config.add_input({"name": "a", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_input({"name": "b", "data_type": "TYPE_INT32", "dims": [1], "optional": True})
    config.add_output({"name": "c", "data_type": "TYPE_FP32", "dims": [4]})
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": True})
    assert config.as_dict()["input"] == [{"name": "a", "data_type": "TYPE_FP32", "dims": [4]},
                                         {"name": "b", "data_type": "TYPE_INT32", "dims": [1], "optional": True}]
    assert config.as_dict()["max_batch_size"] == 8
    assert config.as_dict()["dynamic_batching"] == {}
    assert pb_utils.using_decoupled_model_transaction_policy(config.as_dict())


@pytest.mark.parametrize("declared,call,message", [
    ({"input": [{"name": "a", "data_type": "TYPE_INT32", "dims": [4]}]},
     ("add_input", {"name": "a", "data_type": "TYPE_FP32", "dims": [4]}),
     "configuration expects datatype TYPE_INT32 for input 'a', model provides TYPE_FP32"),
    ({"output": [{"name": "o", "data_type": "TYPE_FP32", "dims": [3]}]},
     ("add_output", {"name": "o", "data_type": "TYPE_FP32", "dims": [4]}),
     "the model expects dims [4] but the model configuration specifies dims [3]"),
    ({}, ("add_input", {"name": "a", "data_type": "TYPE_FP32"}), "missing 'dims' property"),
    ({}, ("add_output", {"name": "o", "data_type": "TYPE_FP32", "dims": [1], "optional": True}),
     "contains property other than"),
    ({"max_batch_size": 16}, ("set_max_batch_size", 4), "configuration specified max_batch_size 16"),
    ({"sequence_batching": {}}, ("set_dynamic_batching",), "scheduling_choice as 'sequence_batching'"),
    ({"model_transaction_policy": {"decoupled": False}}, ("set_model_transaction_policy", {"decoupled": True}),
     "trying to change decoupled property"),
])
def test_auto_complete_refuses_conflicts_as_triton_does(declared, call, message):
    config = pb_utils.ModelConfig(json.dumps(_config(**declared)))
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        getattr(config, call[0])(*call[1:])


def test_config_lookups_return_none_when_absent():
    config = _config(input=[{"name": "a"}])
    assert pb_utils.get_input_config_by_name(config, "a") == {"name": "a"}
    assert pb_utils.get_input_config_by_name(config, "z") is None
    assert pb_utils.get_output_config_by_name(config, "a") is None


def test_responses_and_errors():
    error = pb_utils.TritonError("bad", pb_utils.TritonError.NOT_FOUND)
    assert (error.message(), error.code()) == ("bad", 2)
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL
    response = pb_utils.InferenceResponse(error=error, parameters={"k": 1})
    assert response.has_error() and json.loads(response.parameters()) == {"k": 1}
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse(parameters={"k": [1]})
    request = pb_utils.InferenceRequest(model_name="m", inputs=[pb_utils.Tensor("a", np.ones(1))],
                                        requested_output_names=["o"], request_id="r", correlation_id="s1",
                                        flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START, timeout=7,
                                        parameters={"p": "v"})
    assert (request.request_id(), request.correlation_id(), request.flags(), request.timeout()) == ("r", "s1", 1, 7)
    assert json.loads(request.parameters()) == {"p": "v"}
    assert pb_utils.get_input_tensor_by_name(request, "a").as_numpy().tolist() == [1.0]
    assert pb_utils.get_input_tensor_by_name(request, "b") is None


def test_calls_that_need_the_server_say_so_outside_it():
    with pytest.raises(pb_utils.TritonModelException, match="only inside a model.py"):
        pb_utils.is_model_ready("x")


def test_logger_levels():
    assert [level.name for level in pb_utils.Logger.LogLevel] == ["INFO", "WARNING", "ERROR", "VERBOSE"]
    assert pb_utils.LogLevel.ERROR == pb_utils.Logger.LogLevel.ERROR == pb_utils.Logger.ERROR


def test_tritons_request_option_names_are_there():
    """Models written for Triton name these (qa models, NVIDIA's BLS examples): a missing name failed
    their import or their first call."""
    assert pb_utils.InferenceResponseSender is pb_utils.ResponseSender
    assert (pb_utils.TRITONSERVER_MEMORY_GPU, pb_utils.TRITONSERVER_MEMORY_CPU) == (0, 1)
    assert pb_utils.MemoryType.TRITONSERVER_MEMORY_CPU is pb_utils.TRITONSERVER_MEMORY_CPU
    preferred = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)
    assert (preferred.preferred_memory_type, preferred.preferred_device_id) == (1, 0)
    with pytest.raises(TypeError):
        pb_utils.PreferredMemory(None)
    assert pb_utils.InferenceTrace().get_context() is None
    tensor = pb_utils.Tensor("x", np.zeros(2, np.float32))
    request = pb_utils.InferenceRequest(model_name="m", inputs=[tensor], requested_output_names=["y"],
                                        preferred_memory=preferred, trace=pb_utils.InferenceTrace())
    assert request.preferred_memory is preferred and request.trace().get_context() is None
    assert pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[]).trace().get_context() is None
    with pytest.raises(pb_utils.TritonModelException, match="PreferredMemory"):
        pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], preferred_memory="GPU")
    served = pb_utils.InferenceRequest.served((7, [], ["y"], "", 0, 0, 0, "{}"), [], decoupled=False)  # execute()'s
    assert served.trace().get_context() is None
