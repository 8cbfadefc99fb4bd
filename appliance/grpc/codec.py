"""KServe v2 gRPC messages (Triton's generated ``service_pb2``) <-> core requests and responses.

Pure functions over protobuf messages, unit-tested on their own. Inputs come either as typed
``contents`` or, for all of them at once, as ``raw_input_contents`` (read in place with
``np.frombuffer``); outputs always go back as ``raw_output_contents``, as Triton sends them. Tensors in
shared memory are only described here (``SharedMemoryInput``, ``RequestedOutput.shared_memory``): they
take no ``raw_input_contents`` entry, and an output written into a region comes back with its
parameters and an empty ``raw_output_contents`` entry (so the others keep their positions).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from appliance.core.errors import InputMismatch, InvalidInput
from appliance.core.tensors import element_size, encode_bytes_tensor, numpy_dtype
from appliance.engine.tensor_checks import (
    BYTES_ELEMENT_OVERHEAD,
    DecodeLimits,
    byte_size_words,
    check_shape,
    datatype_size,
    decode_raw_tensor,
)
from appliance.engine.types import InferInput, InferRequest, InferResponse, RequestedOutput, SharedMemoryInput
from appliance.protocol.inference import join_releasing_gil, tensor_work
from appliance.protocol.shared_memory.params import shared_memory_ref

__all__ = ["FINAL_RESPONSE", "decode_infer_request", "encode_infer_response", "encoding_work", "from_parameters",
           "serialize_infer_response", "serialize_stream_response", "set_parameters", "stream_options"]

# The typed field of InferTensorContents that holds each datatype (FP16 and BF16 have none: raw only).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
# What numpy type each typed field's values arrive as (before narrowing to INT8, UINT16...).
_FIELD_DTYPE = {
    "bool_contents": np.bool_,
    "int_contents": np.int32,
    "int64_contents": np.int64,
    "uint_contents": np.uint32,
    "uint64_contents": np.uint64,
    "fp32_contents": np.float32,
    "fp64_contents": np.float64,
}
# The datatype each typed field stands for, as Triton names it in its errors.
_FIELD_DATATYPE = {
    "bool_contents": "BOOL",
    "int_contents": "INT32",
    "int64_contents": "INT64",
    "uint_contents": "UINT32",
    "uint64_contents": "UINT64",
    "fp32_contents": "FP32",
    "fp64_contents": "FP64",
    "bytes_contents": "BYTES",
}


def _ignore(size: int) -> None:
    pass


def from_parameters(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A protobuf map of InferParameter (or ModelRepositoryParameter) as plain Python values."""
    out: dict[str, Any] = {}
    for key, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        out[key] = getattr(parameter, choice) if choice is not None else None
    return out


# Request parameters with Triton's reserved prefix that a client may set (they steer the server, and are
# taken out of what the model sees).
_RESERVED_PREFIX = "triton_"
_EMPTY_FINAL = "triton_enable_empty_final_response"


def stream_options(parameters: dict[str, Any]) -> bool:
    """Take Triton's reserved ``triton_*`` parameters out of a request's parameters, as Triton's gRPC
    front end does; returns ``triton_enable_empty_final_response`` (False when absent)."""
    reserved = [key for key in parameters if key.startswith(_RESERVED_PREFIX)]
    for key in reserved:
        if key != _EMPTY_FINAL:
            raise InvalidInput(
                "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys "
                f"starting with 'triton_' are allowed: {_EMPTY_FINAL}"
            )
    value = parameters.pop(_EMPTY_FINAL, False)
    if not isinstance(value, bool):
        raise InvalidInput(f"invalid value type for '{_EMPTY_FINAL}' parameter, expected bool_param.")
    return value


def set_parameters(target: Any, values: Mapping[str, Any]) -> None:
    """Fill a protobuf map of InferParameter from Python values (bool, int, float, str)."""
    for key, value in values.items():
        parameter = target[key]
        if isinstance(value, bool):
            parameter.bool_param = value
        elif isinstance(value, int):
            if value >= 2**63:
                parameter.uint64_param = value
            else:
                parameter.int64_param = value
        elif isinstance(value, float):
            parameter.double_param = value
        else:
            parameter.string_param = str(value)


def _decode_contents(tensor: Any, datatype: str, shape: tuple[int, ...], count: int, name: str,
                     reserve: Callable[[int], None]) -> np.ndarray:
    field_name = CONTENTS_FIELD.get(datatype)
    if field_name is None:
        raise InvalidInput(f"input '{name}': datatype {datatype} has no typed contents field; send it in "
                           "raw_input_contents")
    values = getattr(tensor.contents, field_name)
    if not values and count:
        other = next((field for field in _FIELD_DATATYPE if getattr(tensor.contents, field)), None)
        if other is not None:
            raise InputMismatch(
                f"input '{name}' is {datatype}, but its data came in contents.{other}; send it in "
                f"contents.{field_name}",
                f"unexpected explicit tensor data for input tensor '{name}' for model '{{model}}' of type "
                f"'{_FIELD_DATATYPE[other]}', expected datatype '{datatype}'",
                prefixed=False,
            )
    if len(values) != count:
        itemsize = element_size(datatype) or 0
        raise InputMismatch(
            f"input '{name}': shape {list(shape)} needs {count} elements, contents.{field_name} has {len(values)}",
            byte_size_words(name, count * itemsize, len(values) * itemsize),
        )
    if datatype == "BYTES":
        reserve(count * BYTES_ELEMENT_OVERHEAD)
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    dtype = numpy_dtype(datatype)
    reserve(count * dtype.itemsize)
    source: np.ndarray = np.array(values, dtype=_FIELD_DTYPE[field_name])
    if source.dtype != dtype:  # INT8/INT16 arrive as int32, UINT8/UINT16 as uint32: check they fit
        info = np.iinfo(dtype)
        if source.size and (source.min() < info.min or source.max() > info.max):
            raise InvalidInput(f"input '{name}': contents.{field_name} holds a value out of {datatype}'s range")
        source = source.astype(dtype)
    return source.reshape(shape)


def _check_shared_memory_types(parameters: Any, name: str) -> None:
    """Triton takes a tensor's shared-memory offset and size only as int64_param."""
    for key in ("shared_memory_offset", "shared_memory_byte_size"):
        parameter = parameters.get(key)
        if parameter is not None and parameter.WhichOneof("parameter_choice") != "int64_param":
            raise InvalidInput(f"invalid value type for '{key}' parameter for tensor '{name}', expected int64_param.")


def decode_infer_request(
    request: pb.ModelInferRequest,
    limits: DecodeLimits = DecodeLimits(),
    reserve: Callable[[int], None] = _ignore,
) -> InferRequest:
    """The core request of a ModelInferRequest. ``reserve(size)`` is called with the bytes each input
    will allocate beyond the message, after its shape is checked and before anything is allocated."""
    # No inputs at all is left to the model's own check: a model may have none (as under Triton).
    if len(request.inputs) > limits.max_inputs:
        raise InvalidInput(f"the request has {len(request.inputs)} inputs; at most {limits.max_inputs} are allowed")
    try:
        return _decode(request, limits, reserve)
    except InputMismatch as mismatch:
        mismatch.request_id = request.id or None
        raise


def _decode(request: pb.ModelInferRequest, limits: DecodeLimits, reserve: Callable[[int], None]) -> InferRequest:
    model = request.model_name
    raw_contents = request.raw_input_contents
    raw_index = 0
    inputs: list[InferInput] = []
    shared_inputs: list[SharedMemoryInput] = []
    for tensor in request.inputs:
        name = tensor.name
        if not name:
            raise InvalidInput(f"an input of the request for model '{model[:255]}' has no name")
        datatype = tensor.datatype
        shape, count = check_shape(list(tensor.shape), name, limits.max_tensor_elements, datatype_size(datatype, name))
        if tensor.parameters:
            _check_shared_memory_types(tensor.parameters, name)
        shared = shared_memory_ref(from_parameters(tensor.parameters), f"input '{name}'") if tensor.parameters else None
        if shared is not None:
            if tensor.HasField("contents"):
                raise InvalidInput(f"input '{name}' names a shared memory region and also carries contents; send "
                                   "it one way")
            shared_inputs.append(SharedMemoryInput(name, datatype, shape, shared))
            continue
        if tensor.HasField("contents"):
            if raw_contents:
                raise InvalidInput(f"contents field must not be specified when using raw_input_contents for "
                                   f"'{name}' for model '{model[:255]}'")
            data = _decode_contents(tensor, datatype, shape, count, name, reserve)
        elif raw_index < len(raw_contents):
            chunk = raw_contents[raw_index]  # a copy out of the message: the tensor is a view of it
            reserve(len(chunk))
            if datatype == "BYTES":
                reserve(min(count, len(chunk) // 4) * BYTES_ELEMENT_OVERHEAD)
            data = decode_raw_tensor(chunk, datatype, shape, count, name, f"raw_input_contents[{raw_index}] size")
            raw_index += 1
        elif count == 0:
            data = decode_raw_tensor(b"", datatype, shape, count, name)
        else:
            raise InvalidInput(f"input '{name}' has no data: set its contents, or raw_input_contents for every "
                               "input")
        inputs.append(InferInput(name, datatype, data))
    # raw_input_contents beyond the inputs' are left unread, as Triton leaves them.
    outputs: list[RequestedOutput] = []
    for output in request.outputs:
        if not output.name:
            raise InvalidInput(f"a requested output of the request for model '{model[:255]}' has no name")
        if output.parameters:
            _check_shared_memory_types(output.parameters, output.name)
        parameters = from_parameters(output.parameters)
        shared = shared_memory_ref(parameters, f"output '{output.name}'")
        classification = parameters.get("classification")
        if classification is not None and (type(classification) is not int or classification <= 0):
            raise InvalidInput("invalid value for 'classification' parameter, expected >= 0")  # Triton's words
        outputs.append(RequestedOutput(output.name, parameters, shared))
    return InferRequest(inputs, outputs, request.id or None, from_parameters(request.parameters), shared_inputs)


def _raw(array: np.ndarray) -> bytes | memoryview:
    if array.dtype == object:
        return encode_bytes_tensor(array)
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


_Outputs = tuple[tuple[str, str, tuple[int, ...]], ...]
"""Each output's name, datatype and shape: what a response's head says of its tensors."""


def _described(response: InferResponse) -> _Outputs:
    return tuple([(o.name, o.datatype, o.data.shape) for o in response.outputs])


def _bare_head(model_name: str, model_version: object, request_id: str,
               outputs: _Outputs) -> pb.ModelInferResponse:
    """A ModelInferResponse without parameters or ``raw_output_contents``."""
    return pb.ModelInferResponse(
        model_name=model_name, model_version=str(model_version), id=request_id,
        outputs=[pb.ModelInferResponse.InferOutputTensor(name=name, datatype=datatype, shape=shape)
                 for name, datatype, shape in outputs])


def _head(response: InferResponse) -> pb.ModelInferResponse:
    """The message without its ``raw_output_contents``."""
    message = _bare_head(response.model_name, response.model_version, response.id or "", _described(response))
    if response.parameters:
        set_parameters(message.parameters, response.parameters)
    return message


@functools.lru_cache(maxsize=256)
def _plain_head(model_name: str, model_version: object, request_id: str, outputs: _Outputs,
                final: bool | None) -> bytes:
    """The serialised head of a response without parameters of its own (``final``: a stream's, with
    FINAL_RESPONSE; None: ModelInfer's): one model's answers share a few, so each is built once (a
    message a response cost several µs)."""
    message = _bare_head(model_name, model_version, request_id, outputs)
    if final is not None:
        message.parameters[FINAL_RESPONSE].bool_param = final
    return message.SerializeToString()


def _head_bytes(response: InferResponse, final: bool | None = None) -> bytes:
    """``_head(response)`` serialised (with FINAL_RESPONSE set to ``final`` unless None), as protobuf
    writes it."""
    if not response.parameters:
        return _plain_head(response.model_name, response.model_version, response.id or "", _described(response),
                           final)
    if final is None:
        return _head(response).SerializeToString()
    # Built as the message is (the head copied into its stream message, then the flag added): protobuf
    # writes a map's entries in the order its table holds them, which a copy may change.
    head = pb.ModelStreamInferResponse(infer_response=_head(response)).infer_response
    head.parameters[FINAL_RESPONSE].bool_param = final
    return head.SerializeToString()


def encode_infer_response(response: InferResponse) -> pb.ModelInferResponse:
    message = _head(response)
    message.raw_output_contents.extend(b"" if o.shared_memory is not None else bytes(_raw(o.data))
                                       for o in response.outputs)
    return message


_RAW_OUTPUT_TAG = b"\x32"
"""raw_output_contents' key on the wire: field 6, length-delimited (the message's last field)."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _message_pieces(head: bytes, response: InferResponse) -> tuple[list[bytes | memoryview], int]:
    """A ModelInferResponse's bytes in pieces: ``head`` (``_head_bytes``), then each of ``response``'s
    tensors as its ``raw_output_contents`` field (protobuf writes fields in number order; that one is the
    last); and their length together."""
    pieces: list[bytes | memoryview] = [head]
    size = len(head)
    for output in response.outputs:
        raw = b"" if output.shared_memory is not None else _raw(output.data)  # (bytes, or a view of bytes)
        length = _varint(len(raw))
        pieces += (_RAW_OUTPUT_TAG, length, raw)
        size += 1 + len(length) + len(raw)
    return pieces, size


def serialize_infer_response(response: InferResponse) -> bytes:
    """``encode_infer_response(response).SerializeToString()``, the same bytes, written without copying the
    tensors into a message and out again, in one join that releases the GIL (``join_releasing_gil``): encoded on a
    worker thread, a large answer stalls no event loop."""
    return join_releasing_gil(*_message_pieces(_head_bytes(response), response))


FINAL_RESPONSE = "triton_final_response"
"""The parameter every ModelStreamInfer response carries: true on the last one of its request."""

_STREAM_INFER_TAG = b"\x12"
"""ModelStreamInferResponse.infer_response's key on the wire: field 2, length-delimited (error_message,
field 1, is empty on a response that has one)."""


def serialize_stream_response(response: InferResponse, final: bool) -> bytes:
    """The ModelStreamInferResponse carrying ``response`` (with FINAL_RESPONSE set to ``final``), the bytes
    protobuf serialises of that message, written as ``serialize_infer_response`` writes ModelInfer's: no
    message holds the tensors, one join that releases the GIL."""
    pieces, size = _message_pieces(_head_bytes(response, final), response)
    length = _varint(size)
    return join_releasing_gil([_STREAM_INFER_TAG, length, *pieces], 1 + len(length) + size)


def encoding_work(response: InferResponse) -> int:
    """The bytes serialising ``response`` works through, for the off-loop rule
    (``appliance.protocol.inference.decode_off_loop``)."""
    work = 0
    for output in response.outputs:  # (a loop: a generator costs a frame, every answer)
        if output.shared_memory is None:
            work += tensor_work(output.data)
    return work
