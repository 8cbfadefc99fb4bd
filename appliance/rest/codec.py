"""KServe v2 inference bodies <-> core requests/responses, including Triton's binary tensor extension.

Pure functions over bytes: no aiohttp here, so the codec is unit-tested on its own. Binary input
tensors are read in place (``np.frombuffer`` over the body), and no buffer is ever sized from a
client's claim before the claim is checked against the bytes actually received. Tensors in shared
memory are only described here (``SharedMemoryInput``, ``RequestedOutput.shared_memory``): the data
plane reads and writes them. A large answer is encoded on a worker thread (``encode_answer``), in chunks
that let the event loop in.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from itertools import chain
from typing import Any

import numpy as np
import orjson

from appliance.core.errors import InputMismatch, InvalidInput
from appliance.core.kept import KEPT_KEY_SETS, kept_keys, remember
from appliance.core.tensors import decode_bytes_tensor, element_size, encode_bytes_tensor, is_bf16, numpy_dtype
from appliance.engine.tensor_checks import (
    BYTES_ELEMENT_OVERHEAD,
    MAX_ELEMENTS,
    DecodeLimits,
    check_shape,
    datatype_size,
    decode_raw_tensor,
)
from appliance.engine.types import InferInput, InferRequest, InferResponse, RequestedOutput, SharedMemoryInput
from appliance.protocol.inference import DECODE_OFF_LOOP_BYTES, decode_off_loop, join_releasing_gil, tensor_work
from appliance.protocol.shared_memory.params import shared_memory_ref
from appliance.rest.http_basics import HEADER_LENGTH

__all__ = [
    "DecodeLimits",
    "MAX_ELEMENTS",
    "decode_bytes_tensor",
    "decode_infer_request",
    "decode_json_data",
    "decode_raw_request",
    "encode_answer",
    "encode_bytes_tensor",
    "encode_infer_response",
    "encode_in_pieces",
    "binary_answer",
    "encoding_work",
    "input_allocation",
    "json_numbers",
    "non_finite_token",
    "output_text",
    "parse_json_object",
    "plain_answer",
]

_DEFAULT_LIMITS = DecodeLimits()


def input_allocation(itemsize: int | None, count: int, binary: bool, available: int) -> int:
    """Bytes that decoding one input allocates beyond the body, bounded by what the ``available`` bytes
    can hold (so a shape claim alone reserves nothing): a JSON element takes at least a byte of text, a
    binary BYTES element its 4-byte length prefix; binary fixed-size tensors are views of the body.
    ``itemsize``: the datatype's (None for BYTES)."""
    if itemsize is None:
        return min(count, available // 4 if binary else available) * BYTES_ELEMENT_OVERHEAD
    # (not min(): a builtin that parses keywords on every call, for every input of every request)
    return 0 if binary else (count if count < available else available) * itemsize


def _negative(dims: list) -> bool:
    """Whether a JSON shape holds a negative integer (a shape of integers alone, the common one, in C)."""
    if set(map(type, dims)) <= _INT:
        return min(dims) < 0
    return any(type(d) is int and d < 0 for d in dims)


_INT = {int}
_NONE: dict[str, Any] = {}
"""An input's parameters where it sends none (read only, never handed on)."""


def _ignore(size: int) -> None:
    pass


def _parse_header(body: bytes, header_length: int | None) -> dict[str, Any]:
    if header_length is not None and not 0 <= header_length <= len(body):
        raise InvalidInput(
            f"inference header size should be in range (0, {len(body)}), got: {header_length}; {HEADER_LENGTH} is "
            "larger than the body"
        )
    text = body if header_length is None else body[:header_length]
    return parse_json_object(text, "a JSON object with an 'inputs' list")


_ORJSON_DEPTH = 1024
"""The nesting orjson reads at most (its own bound, which keeps parsing off deep recursion)."""


class JsonTooDeep(InvalidInput):
    """A body nested deeper than the JSON parser reads (a handler may say what that member must be)."""


def parse_json_object(text: bytes, expected: str) -> dict[str, Any]:
    """A request body that must be a JSON object; ``expected`` describes it in the error."""
    try:
        document = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):  # orjson's bound (1024 levels): deeper than any control body needs
            raise JsonTooDeep(f"JSON nesting depth exceeds the maximum this server reads ({_ORJSON_DEPTH}); the "
                              f"request body must be {expected}") from None
        raise InvalidInput(f"malformed JSON in the request body: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidInput(f"the request body must be {expected}")
    return document


def _parameters(obj: dict[str, Any], where: str) -> dict[str, Any]:
    params = obj.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InvalidInput(f"'parameters' of {where} must be a JSON object")
    return params


# Triton's limit on a request document's nesting; a tensor's 'data' sits 3 levels down ({"inputs": [{...}]}).
MAX_JSON_DEPTH = 100
_DATA_DEPTH = MAX_JSON_DEPTH - 3


def _too_deep(name: str) -> InvalidInput:
    return InvalidInput(f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH}); input '{name}': "
                        "send 'data' flat (its shape says how it is laid out)")


# Triton's JSON reader's words when a value is not of the tensor's type (TritonJson), said first.
_TYPE_WORDS = {"b": "attempt to access JSON non-boolean as boolean",
               "i": "attempt to access JSON non-signed-integer as signed-integer",
               "u": "attempt to access JSON non-unsigned-integer as unsigned-integer",
               "f": "attempt to access JSON non-number as double",
               "O": "attempt to access JSON non-string as string"}


def json_type_words(datatype: str) -> str:
    """What Triton says of a JSON value that is not of ``datatype``."""
    return _TYPE_WORDS["O" if datatype == "BYTES" else numpy_dtype(datatype).kind]


def _flatten_strings(data: Any, name: str) -> list[bytes]:
    out: list[bytes] = []
    stack = [(data, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, list):
            if depth >= _DATA_DEPTH:
                raise _too_deep(name)
            stack.extend((inner, depth + 1) for inner in reversed(item))
        elif isinstance(item, str):
            out.append(item.encode("utf-8"))
        else:
            raise InvalidInput(f"{_TYPE_WORDS['O']}: input '{name}': BYTES data must be strings, got "
                               f"{type(item).__name__}")
    return out


# numpy kinds of the parsed JSON values each datatype kind accepts (Triton refuses 1.5 for INT32 and
# 1 for BOOL, and takes integers for floats).
_ACCEPTED_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}
_KIND_WORDS = {"b": "true/false values", "i": "integers", "u": "integers", "f": "numbers"}


def _describe(values: np.ndarray) -> str:
    return {"b": "booleans", "i": "integers", "u": "integers", "f": "non-integer numbers",
            "U": "strings"}.get(values.dtype.kind, "values of mixed or unsupported types")


def _exact_integers(data: list, source: np.ndarray, name: str, datatype: str) -> np.ndarray:
    """``source`` read again without rounding where numpy made float64 of integers past int64 mixed with
    smaller ones ([2**63, 0]): UINT64 values a client may send. Unchanged when they are not all integers."""
    exact = np.array(data, dtype=object)
    if exact.shape != source.shape or not all(type(value) is int for value in exact.flat):
        return source
    try:
        return exact.astype(np.uint64)
    except OverflowError:  # a negative integer beside one past int64: no integer type holds both
        raise InvalidInput(f"input '{name}': 'data' does not hold {datatype} values: a value is out of range") from None


_LARGEST = {np.dtype(t): float(np.finfo(t).max) for t in (np.float16, np.float32, np.float64)}
_FLOAT_DTYPES = {name: numpy_dtype(name) for name in ("FP16", "FP32", "FP64")}
_FLOAT = {float}
_INT_DTYPES = {name: numpy_dtype(name) for name in ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32",
                                                    "UINT64")}
_INT_RANGE = {dtype: (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max)) for dtype in _INT_DTYPES.values()}
_INT = {int}
_NUMPY_RANGE_CHECK = 128
"""Below this many values a flat list of floats is checked in Python (every value a float, then max()
and min() against the type's range: 2.3 µs against numpy's 5.4 at 16 values, a small request's tensor).
From it on the list is packed into doubles by ``struct``, which refuses what is not a number as it goes,
and the range and boolean checks run on the array: at the CNN's 37,632 values, 0.5 ms against 2.8 for a
type test of every value and numpy's conversion (the type test alone cost as much as the conversion;
numpy's conversion and the C ``array`` type's, which parses each value's arguments, 1.4 and 1.3 ms
against struct's 0.4)."""


def _fits(data: list, flat: bool, source: np.ndarray, target: np.dtype) -> bool:
    """Whether casting JSON numbers read as ``source`` (from ``data``, a flat list where ``flat``) to the
    float type ``target`` overflows nowhere: always for the same type, and for integers (at most 2**64,
    which every float type but FP16 holds); otherwise when every value lies within ``target``'s range,
    checked in C (the list's own min and max where it is flat and short, two reductions over ``source``
    otherwise)."""
    if source.dtype == target or (source.dtype.kind != "f" and target.itemsize >= 4):
        return True
    largest = _LARGEST.get(target)
    if largest is None or not source.size:
        return False
    if flat and source.size < _NUMPY_RANGE_CHECK:
        return max(data) <= largest and min(data) >= -largest
    return bool(np.maximum.reduce(source, axis=None) <= largest and np.minimum.reduce(source, axis=None) >= -largest)


def _holds_booleans(data: list, source: np.ndarray) -> bool:
    """Whether numbers read as ``source`` (from ``data``) were JSON ``true`` or ``false``: numpy reads a
    boolean beside numbers as a 1 or a 0, so only where a value is 1 or 0 is there a type to look at. A
    flat list's few such values are looked up one by one; where they are many (over half: a lookup costs
    about twice a step of the whole scan), and in nested lists, every value's type is."""
    where = np.flatnonzero((source == 0) | (source == 1))
    if not where.size:
        return False
    items: Any = data
    if source.ndim == 1 and where.size * 2 < source.size:
        items = map(data.__getitem__, where.tolist())
    for _ in range(source.ndim - 1):  # nested lists (as rectangular as numpy found them): their values
        items = chain.from_iterable(items)
    return bool in set(map(type, items))


def _flat_floats(data: list, dtype: np.dtype) -> np.ndarray | None:
    """A flat list of JSON numbers as the float type ``dtype``; None where the general path must decide
    (and say what is wrong): a value that is not a number, a boolean, a value past the type's range."""
    if len(data) < _NUMPY_RANGE_CHECK:
        largest = _LARGEST[dtype]
        if set(map(type, data)) == _FLOAT and max(data) <= largest and min(data) >= -largest:
            return np.array(data, dtype=dtype)
        return None
    try:  # each number exactly as a double (JSON's numbers are); a string, null, list or object refused
        doubles = np.frombuffer(struct.pack(f"{len(data)}d", *data), dtype=np.float64)
    except (struct.error, OverflowError):
        return None
    if not _fits(data, True, doubles, dtype) or _holds_booleans(data, doubles):
        return None
    return doubles.astype(dtype, copy=False)


def _flat_ints(data: list, dtype: np.dtype) -> np.ndarray | None:
    """A short flat list of JSON integers as the integer type ``dtype``; None where the general path must
    decide (and say what is wrong): a value that is not an integer (a boolean is not), one past the type's
    range, or a list too long for a check in Python (``_NUMPY_RANGE_CHECK``)."""
    if len(data) >= _NUMPY_RANGE_CHECK:
        return None
    low, high = _INT_RANGE[dtype]
    if set(map(type, data)) == _INT and min(data) >= low and max(data) <= high:
        return np.array(data, dtype=dtype)
    return None


def decode_json_data(data: Any, datatype: str, shape: tuple[int, ...], count: int, name: str) -> np.ndarray:
    # Any nesting is accepted as long as the element count matches, down to Triton's depth limit (numpy
    # refuses ragged lists, so the first elements' chain is the depth of a list it takes).
    if datatype == "BF16":  # JSON numbers would round through FP64 to BF16 behind the client's back
        raise InvalidInput(f"receiving BF16 data via JSON is not supported. Please use the binary data format for "
                           f"input {name}")
    if not isinstance(data, list):
        data = [data]
    if datatype == "BYTES":
        items = _flatten_strings(data, name)
        if len(items) != count:
            raise InvalidInput(
                f"input '{name}': shape {list(shape)} needs {count} elements, 'data' has {len(items)}"
            )
        array = np.empty(count, dtype=object)
        array[:] = items
        return array.reshape(shape)
    dtype = _FLOAT_DTYPES.get(datatype)
    if dtype is not None:
        if len(data) == count and (floats := _flat_floats(data, dtype)) is not None:
            return floats.reshape(shape)
    elif (dtype := _INT_DTYPES.get(datatype)) is not None and len(data) == count \
            and (ints := _flat_ints(data, dtype)) is not None:
        return ints.reshape(shape)
    depth, first = 0, data
    while isinstance(first, list) and first:
        depth, first = depth + 1, first[0]
        if depth > _DATA_DEPTH:
            raise _too_deep(name)
    try:
        dtype = numpy_dtype(datatype)
        source = np.array(data)  # the JSON values' own kind first: 1.5 must not become an INT32 1
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidInput(f"input '{name}': 'data' does not hold {datatype} values ({exc})") from None
    if source.size != count:
        raise InvalidInput(
            f"input '{name}': shape {list(shape)} needs {count} elements, 'data' has {source.size}"
        )
    if source.size and dtype.kind != "b" and source.dtype.kind in "iuf" and _holds_booleans(data, source):
        raise InvalidInput(
            f"{_TYPE_WORDS[dtype.kind]}: input '{name}': 'data' does not hold {datatype} values: expected "
            f"{_KIND_WORDS[dtype.kind]}, got booleans among them"
        )
    if source.size and dtype.kind in "iu" and source.dtype.kind == "f":
        source = _exact_integers(data, source, name, datatype)
    if source.size and source.dtype.kind not in _ACCEPTED_KINDS[dtype.kind]:
        raise InvalidInput(
            f"{_TYPE_WORDS[dtype.kind]}: input '{name}': 'data' does not hold {datatype} values: expected "
            f"{_KIND_WORDS[dtype.kind]}, got {_describe(source)}"
        )
    if dtype.kind != "f" or _fits(data, depth == 1, source, dtype):
        array = source.astype(dtype, copy=False)
        if dtype.kind in "iu" and source.size and not np.array_equal(array, source):
            raise InvalidInput(f"input '{name}': 'data' does not hold {datatype} values: a value is out of range")
        return array.reshape(shape)
    with np.errstate(over="ignore"):  # (a value past the type's largest may still round to it)
        array = source.astype(dtype, copy=False)
    if source.size and not np.isfinite(array).all():
        # JSON holds no infinities: a value that became one did not fit (1e39 as FP32).
        raise InvalidInput(f"input '{name}': 'data' does not hold {datatype} values: a value is beyond "
                           f"{datatype}'s range (±{float(np.finfo(dtype).max):.6g}); send it as binary data to pass "
                           "an infinity")
    return array.reshape(shape)


def _decode_binary_data(
    body: memoryview, offset: int, size: Any, datatype: str, shape: tuple[int, ...], count: int, name: str
) -> np.ndarray:
    if type(size) is not int or size < 0:
        raise InvalidInput(f"input '{name}': binary_data_size must be a non-negative integer, got {size!r}")
    if offset + size > len(body):
        raise InvalidInput(
            f"input '{name}': binary_data_size is {size}, but only {len(body) - offset} bytes of "
            "binary data remain in the body"
        )
    return decode_raw_tensor(body[offset : offset + size], datatype, shape, count, name, "binary_data_size")


def decode_infer_request(
    body: bytes,
    header_length: int | None = None,
    limits: DecodeLimits = _DEFAULT_LIMITS,
    reserve: Callable[[int], None] = _ignore,
) -> InferRequest:
    """Decode a v2 infer body; ``header_length`` is the Inference-Header-Content-Length, if sent.

    ``reserve(size)`` is called with the bytes each input will allocate, after its shape is checked and
    before anything is allocated; it may raise to refuse (the transport's memory budget does)."""
    header = _parse_header(body, header_length)
    try:
        return _decode_request(header, body, header_length, limits, reserve)
    except InputMismatch as mismatch:
        request_id = header.get("id")
        mismatch.request_id = request_id if isinstance(request_id, str) else None
        raise


def _decode_request(header: dict[str, Any], body: bytes, header_length: int | None, limits: DecodeLimits,
                    reserve: Callable[[int], None]) -> InferRequest:
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list):
        # Empty is allowed: a model may have no inputs (Triton's Python models that only call others).
        raise InvalidInput("the request must have an 'inputs' list")
    if len(raw_inputs) > limits.max_inputs:
        raise InvalidInput(f"the request has {len(raw_inputs)} inputs; at most {limits.max_inputs} are allowed")
    view: memoryview | None = None  # (made for the first binary input)
    offset = len(body) if header_length is None else header_length
    json_bytes = offset  # the JSON header's size bounds how many elements its 'data' can hold
    inputs: list[InferInput] = []
    shared_inputs: list[SharedMemoryInput] = []
    for position, raw in enumerate(raw_inputs):
        if not isinstance(raw, dict):
            raise InvalidInput(f"inputs[{position}] must be a JSON object")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"inputs[{position}] needs a 'name' string")
        datatype = raw.get("datatype", "")  # (none: refused as an empty one is)
        itemsize = datatype_size(datatype, name)  # (a known datatype's name from here on)
        dims = raw.get("shape")
        try:
            shape, count = check_shape(dims, name, limits.max_tensor_elements, itemsize)
        except InvalidInput:  # (asked only of a shape refused: a good one has no negative dimension)
            if type(dims) is list and dims and _negative(dims):  # Triton's JSON reader's words
                raise InvalidInput(f"Unable to parse 'shape': attempt to access JSON non-unsigned-integer as "
                                   f"unsigned-integer; input '{name}': 'shape' must be non-negative integers, "
                                   f"got {dims!r}"[:400]) from None
            raise
        params = raw.get("parameters")
        if params is None and "data" in raw:  # the common input: its values in the JSON, nothing asked of it
            reserve(input_allocation(itemsize, count, False, json_bytes))
            inputs.append(InferInput(name, datatype, decode_json_data(raw["data"], datatype, shape, count, name)))
            continue
        params = _NONE if params is None else _parameters(raw, f"input '{name}'")
        shared = shared_memory_ref(params, f"input '{name}'") if params else None
        if shared is not None:
            if "binary_data_size" in params or "data" in raw:
                raise InvalidInput(
                    f"input '{name}' names a shared memory region and also carries data in the request; send it "
                    "one way"
                )
            shared_inputs.append(SharedMemoryInput(name, datatype, shape, shared))
            continue
        binary = "binary_data_size" in params
        reserve(input_allocation(itemsize, count, binary, len(body) - offset if binary else json_bytes))
        if binary:
            if header_length is None:
                raise InvalidInput(
                    f"input '{name}' has binary_data_size but the request has no {HEADER_LENGTH} header"
                )
            size = params["binary_data_size"]
            if view is None:
                view = memoryview(body)
            data = _decode_binary_data(view, offset, size, datatype, shape, count, name)
            offset += size
        elif "data" in raw:
            data = decode_json_data(raw["data"], datatype, shape, count, name)
        else:
            raise InvalidInput("Input must set only one of the following fields: 'data', 'binary_data_size' in "
                               "'parameters', 'shared_memory_region' in 'parameters'. But no field is set; input "
                               f"'{name}' has none")
        inputs.append(InferInput(name, datatype, data))
    if offset != len(body):
        raise InvalidInput(
            f"the body has {len(body) - offset} bytes of binary data that no input's binary_data_size covers"
        )
    outputs: list[RequestedOutput] = []
    raw_outputs = header.get("outputs") or []
    if not isinstance(raw_outputs, list):
        raise InvalidInput("'outputs' must be a list")
    for position, raw in enumerate(raw_outputs):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise InvalidInput(f"outputs[{position}] must be an object with a 'name' string")
        params = _parameters(raw, f"output '{raw['name']}'")
        shared = shared_memory_ref(params, f"output '{raw['name']}'")
        classification = params.get("classification", 0)
        if type(classification) is not int or classification < 0:
            raise InvalidInput(f"output '{raw['name']}': classification must be a non-negative integer")
        outputs.append(RequestedOutput(raw["name"], params, shared))
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput("'id' must be a string")
    return InferRequest(inputs, outputs, request_id, _request_parameters(header), shared_inputs)


def _request_parameters(header: dict[str, Any]) -> dict[str, Any]:
    """The request's parameters; keys with Triton's reserved prefix refused, as Triton's HTTP front end does
    (over gRPC ``triton_enable_empty_final_response`` is allowed: it steers the stream)."""
    if "parameters" not in header:  # the common request: none (a new dict: a request's own)
        return {}
    params = _parameters(header, "the request")
    keys = tuple(params)
    if keys not in _UNRESERVED:  # (a sequence's steps send the same keys every time: checked once)
        for key in keys:  # (a loop: any() over a generator costs a frame)
            if isinstance(key, str) and key.startswith("triton_"):
                raise InvalidInput("parameter keys starting with 'triton_' are reserved for Triton usage and should "
                                   "not be specified.")
        if kept_keys(keys):
            remember(_UNRESERVED, keys, True, KEPT_KEY_SETS)
    return params


_UNRESERVED: dict[tuple[str, ...], bool] = {}
"""Keys of request parameters found free of Triton's reserved prefix (small sets only: ``kept_keys``)."""


def output_text(name: str, item: object) -> str:
    if not isinstance(item, bytes):
        return str(item)
    try:
        return item.decode("utf-8")
    except UnicodeDecodeError:
        # Replacing the bad bytes would hand the client different bytes than the model produced.
        raise InvalidInput(
            f"output '{name}' holds BYTES that are not valid UTF-8 and cannot be returned as JSON; request it "
            "as binary data (output parameters binary_data: true, or binary_data_output: true)"
        ) from None


def decode_raw_request(
    body: bytes,
    name: str,
    datatype: str,
    shape: tuple[int, ...],
    limits: DecodeLimits = _DEFAULT_LIMITS,
    reserve: Callable[[int], None] = _ignore,
    one_element: bool = False,
) -> InferRequest:
    """Triton's raw binary request (``Inference-Header-Content-Length: 0``): the whole body is the
    model's only input, ``shape`` as its config gives it (one -1 is taken from the body's size); every
    output is returned as binary data. A BYTES input must be declared with dims [1] (``one_element``):
    the body is then its one element, without a length prefix, as Triton reads it."""
    if datatype == "BYTES":
        if not one_element:
            raise InvalidInput(f"[request id: <id_unknown>] For BYTE datatype raw input '{name}', the model must "
                               f"have input shape [1]; send a JSON header with {HEADER_LENGTH} instead")
        reserve(len(body) + BYTES_ELEMENT_OVERHEAD)
        element = np.empty(1, dtype=object)
        element[0] = bytes(body)
        return InferRequest([InferInput(name, datatype, element.reshape(shape))], [], None,
                            {"binary_data_output": True})
    itemsize = element_size(datatype)
    variable = [i for i, d in enumerate(shape) if d < 0]
    if variable and (itemsize is None or len(variable) > 1):
        raise InvalidInput(  # Triton's words, then the fix
            f"The shape of the raw input '{name}' can not be deduced because there are more than one "
            f"variable-sized dimension ({list(shape)}); send a JSON header with {HEADER_LENGTH} instead"
        )
    if variable:
        assert itemsize is not None  # BYTES with a variable dim was refused above
        known = math.prod(d for d in shape if d >= 0)
        if known == 0 or len(body) % (known * itemsize):
            raise InvalidInput(
                f"raw binary request: {len(body)} bytes are not a whole number of {datatype} elements of input "
                f"'{name}' with shape {list(shape)}"
            )
        shape = tuple(len(body) // (known * itemsize) if d < 0 else d for d in shape)
    _, count = check_shape(list(shape), name, limits.max_tensor_elements)
    reserve(input_allocation(itemsize, count, True, len(body)))
    data = decode_raw_tensor(memoryview(body), datatype, shape, count, name, "the raw binary body")
    return InferRequest([InferInput(name, datatype, data)], [], None, {"binary_data_output": True})


def _json_refused(name: str) -> InvalidInput:
    """Triton's error (its words first) for a BF16 output a client asked for as JSON."""
    return InvalidInput(f"sending BF16 data via JSON is not supported. Please use the binary data format for output "
                        f"('{name}': ask for it with binary_data: true, or binary_data_output: true)")


def non_finite_token(value: float) -> bytes:
    """How Triton writes a value JSON has no number for."""
    return b"NaN" if math.isnan(value) else b"Infinity" if value > 0 else b"-Infinity"


_CHUNK = 1 << 16
"""Elements orjson writes in one call. orjson holds the GIL for a whole call, so a large answer, though
encoded on a worker thread, would stall the event loop for as long: in chunks the loop gets the GIL back
every millisecond or two."""

_JSON_NUMBER_BYTES = 25
"""The most text one number takes in a JSON answer (``-1.7976931348623157e+308`` and its comma)."""

_TOKENS = np.array([b"NaN", b"Infinity", b"-Infinity"], dtype=object)


def _numbers_text(values: np.ndarray) -> bytes:
    """A 1-D numeric array's JSON text without its brackets; NaN and infinities as ``non_finite_token``
    writes them. orjson writes each of them as ``null`` (and no number has an 'n'), so the k-th null is
    the k-th non-finite value: split there and put the values' tokens in, with no step per element."""
    text = orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
    if values.dtype.kind != "f" or b"n" not in text:  # (no null: every value is finite)
        return text
    finite = np.isfinite(values)
    odd = values[~finite]
    tokens = _TOKENS[np.where(np.isnan(odd), 0, np.where(odd > 0, 1, 2))].tolist()
    gaps = text.split(b"null")
    pieces = [b""] * (2 * len(gaps) - 1)
    pieces[0::2] = gaps
    pieces[1::2] = tokens
    return b"".join(pieces)


def _json_array(values: np.ndarray, text: Callable[[np.ndarray], bytes]) -> list[bytes]:
    """A JSON array of ``values`` (1-D) in pieces to join, ``text`` writing each chunk's items."""
    if values.size <= _CHUNK:
        return [b"[", text(values), b"]"]
    pieces = [b"["]
    for start in range(0, values.size, _CHUNK):
        if start:
            pieces.append(b",")
        pieces.append(text(values[start:start + _CHUNK]))
    pieces.append(b"]")
    return pieces


def json_numbers(array: np.ndarray) -> list[bytes]:
    """A numeric tensor's values as a JSON array, in pieces for ``b"".join``, with infinities and NaN as
    Triton writes them (``Infinity``, ``-Infinity``, ``NaN``: JavaScript's words, which Python's json and
    tritonclient read; strict JSON parsers do not, so ask for such outputs as binary data when a client
    needs them exactly). Vectorised: no Python step per element, whatever the values."""
    values = np.ascontiguousarray(array).ravel()
    if values.size <= _CHUNK:  # (the common answer: one piece of text)
        return [b"[", _numbers_text(values), b"]"]
    return _json_array(values, _numbers_text)


def _json_data(name: str, array: np.ndarray) -> list[bytes]:
    if array.dtype.kind == "V" and is_bf16(array.dtype):
        raise _json_refused(name)
    if array.dtype == object:
        return _json_array(array.ravel(), lambda items: orjson.dumps([output_text(name, item) for item in items])[1:-1])
    return json_numbers(array)


def _raw_bytes(array: np.ndarray) -> bytes | memoryview:
    if array.dtype == object:
        return encode_bytes_tensor(array)
    # A view, not a copy: the body's one join copies it (with the GIL released, for a large one).
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def _binary_choice(request: InferRequest | None) -> Callable[[str], bool] | None:
    """Whether the request asked for an output as binary data: per output ``binary_data``, else the
    request-wide ``binary_data_output`` (for outputs it does not list), as Triton's http_server decides.
    None where it asked for none (the common small request, and one whose parameters are others': a
    sequence's)."""
    if request is None or (not request.outputs and not request.parameters):
        return None
    if len(request.outputs) == 1 and not request.parameters:
        # One output named and nothing request-wide (a binary client's request): that one, where it asks.
        asked = request.outputs[0]
        return asked.name.__eq__ if asked.parameters.get("binary_data", False) else None
    default = bool(request.parameters.get("binary_data_output", False))
    if not default and not request.outputs:
        return None
    wanted = {o.name: o.parameters for o in request.outputs}

    def binary(name: str) -> bool:
        params = wanted.get(name)
        return default if params is None else bool(params.get("binary_data", False))
    return binary


def encoding_work(response: InferResponse, request: InferRequest | None = None) -> int:
    """The bytes ``encode_infer_response`` writes, at most (a JSON number's longest text per element),
    for the off-loop rule (``appliance.protocol.inference.decode_off_loop``): small answers are encoded on
    the loop, large ones on a worker thread."""
    binary = _binary_choice(request)
    work = 0
    for output in response.outputs:
        if output.shared_memory is not None:
            continue
        data = output.data
        if data.dtype == object or (binary is not None and binary(output.name)):
            work += tensor_work(data)
        else:
            work += data.size * _JSON_NUMBER_BYTES
    return work


def encode_infer_response(
    response: InferResponse, request: InferRequest | None = None
) -> tuple[bytes, int | None]:
    """Encode a response; returns the body and the JSON header length (None for a pure JSON body).

    Outputs go binary when the request asked (per output ``binary_data`` or request-wide
    ``binary_data_output``), as Triton does. The body is written in pieces and joined once: the tensors'
    text is never copied into a document and out again (a join of a large body releases the GIL).
    """
    plain = plain_answer(response, request)
    if plain is not None:
        return plain, None
    return encode_in_pieces(response, request)


def encode_in_pieces(response: InferResponse, request: InferRequest | None = None) -> tuple[bytes, int | None]:
    """``encode_infer_response`` without its first try (``plain_answer``), for a caller that tried it already:
    any answer, written in pieces and joined once."""
    binary = _binary_choice(request)
    if binary is not None:
        answer = _binary_answer(response, binary)
        if answer is not None:
            return answer
    return _in_pieces(response, binary)


def binary_answer(response: InferResponse, request: InferRequest | None) -> tuple[bytes, int] | None:
    """The common answer of a binary client (every output numeric and asked for as binary data, none in
    shared memory), small enough to write on the event loop: its body and JSON header length, the header
    written once for its shapes. None for any other answer (``plain_answer``, ``encoding_work``)."""
    binary = _binary_choice(request)
    return None if binary is None else _binary_answer(response, binary, DECODE_OFF_LOOP_BYTES)


_PLAIN_KINDS = frozenset("biuf")
_BINARY_HEADERS: dict[tuple, bytes] = {}
"""The JSON headers of answers whose outputs all go as binary data, by what they say (the model, its
version, the request's ID and each output's name, datatype, shape and byte count): a client's answers
repeat them."""
_MAX_BINARY_HEADERS = 256
_KEPT_HEADER = 4096
"""The longest header kept: the table holds 1 MiB at most."""
_COPIED = 4096
"""A binary output this small is copied out in one call (``tobytes``), not viewed in four."""
_KEPT_ID = 64
"""The longest request ID whose answers' headers are kept (perf_analyzer sends ``"id": ""``)."""


def _binary_answer(response: InferResponse, binary: Callable[[str], bool],
                   most: int | None = None) -> tuple[bytes, int] | None:
    """The answer whose outputs are all numeric and all asked for as binary data (none in shared memory,
    not all empty, at most ``most`` bytes of them), its header written once for its shapes; None for any
    other (or one with response parameters or a long request ID)."""
    if response.parameters or (response.id is not None and len(response.id) > _KEPT_ID):
        return None
    key: list[object] = [response.model_name, response.model_version, response.id]
    chunks: list[bytes | memoryview] = []
    written = 0
    for output in response.outputs:
        data = output.data
        if output.shared_memory is not None or data.dtype.kind not in _PLAIN_KINDS or not binary(output.name):
            return None
        size = data.nbytes
        key += (output.name, output.datatype, data.shape, size)
        chunks.append(data.tobytes() if size <= _COPIED else _raw_bytes(data))
        written += size
    if not written or (most is not None and written > most):  # (all empty: a plain JSON answer, as Triton's)
        return None
    header = _BINARY_HEADERS.get(known := tuple(key))
    if header is None:
        body, header_length = _in_pieces(response, binary)
        assert header_length is not None
        header = body[:header_length]
        if len(header) <= _KEPT_HEADER:  # (a model of many outputs writes a long one: not kept)
            remember(_BINARY_HEADERS, known, header, _MAX_BINARY_HEADERS)
    return join_releasing_gil([header, *chunks], len(header) + written), len(header)


def _in_pieces(response: InferResponse, binary: Callable[[str], bool] | None) -> tuple[bytes, int | None]:
    entries: list[list[bytes]] = []
    chunks: list[bytes | memoryview] = []
    for output in response.outputs:
        entry: dict[str, Any] = {
            "name": output.name,
            "datatype": output.datatype,
            "shape": list(output.data.shape),
        }
        if output.shared_memory is not None:
            entries.append([orjson.dumps(entry)])  # in the client's region: no data (nor its parameters)
        elif binary is not None and binary(output.name):
            raw = _raw_bytes(output.data)
            entry["parameters"] = {"binary_data_size": len(raw)}
            entries.append([orjson.dumps(entry)])
            chunks.append(raw)
        else:  # "data" comes last: it is spliced in before the entry's closing brace
            entries.append([orjson.dumps(entry)[:-1], b',"data":', *_json_data(output.name, output.data), b"}"])
    document: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": str(response.model_version),
    }
    if response.id is not None:
        document["id"] = response.id
    if response.parameters:
        document["parameters"] = response.parameters
    header = [orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)[:-1], b',"outputs":[']
    for position, pieces in enumerate(entries):
        if position:
            header.append(b",")
        header.extend(pieces)
    header.append(b"]}")
    if not any(chunks):  # no binary bytes at all (none asked, or all empty): plain JSON, as Triton answers
        return b"".join(header), None
    return join_releasing_gil([*header, *chunks]), sum(map(len, header))


_PLAIN_ELEMENTS = DECODE_OFF_LOOP_BYTES // _JSON_NUMBER_BYTES
"""The most elements a plain answer holds: its encoding is event-loop work (``encoding_work``'s bound)."""


def plain_answer(response: InferResponse, request: InferRequest | None = None) -> bytes | None:
    """The common answer, where the request asks for nothing binary and every output is numeric, none in
    shared memory, all of them together small enough to encode on the event loop: written by one orjson
    call with the tensors in the document, the same text as ``encode_infer_response`` writes. None where
    that must write it (a non-finite value, which orjson writes as ``null``; a large, BYTES or BF16 output;
    an array orjson does not take): then ``encoding_work`` says where."""
    if request is not None and (request.outputs or (request.parameters  # (``_binary_choice`` is not None)
                                                    and request.parameters.get("binary_data_output", False))):
        return None
    entries = []
    elements = 0
    for output in response.outputs:
        data = output.data
        elements += data.size
        if output.shared_memory is not None or data.dtype.kind not in _PLAIN_KINDS or elements > _PLAIN_ELEMENTS:
            return None
        entries.append({"name": output.name, "datatype": output.datatype, "shape": list(data.shape),
                        "data": data.ravel()})
    document: dict[str, Any] = {"model_name": response.model_name, "model_version": str(response.model_version)}
    if response.id is not None:
        document["id"] = response.id
    if response.parameters:
        document["parameters"] = response.parameters
    document["outputs"] = entries
    try:
        text = orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:  # (orjson.JSONEncodeError is one): e.g. an array not in native byte order
        return None
    return None if b"null" in text else text  # a NaN or an infinity (or a parameter's null): the general path


async def encode_answer(response: InferResponse, request: InferRequest | None = None) -> tuple[bytes, int | None]:
    """``encode_infer_response``, on a worker thread when the answer is large (``encoding_work``), so that
    no answer's size stalls the event loop; a small one is encoded inline, where a thread costs more."""
    return await decode_off_loop(encoding_work(response, request), encode_infer_response, response, request)
