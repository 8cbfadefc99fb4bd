"""Triton's generate extension bodies <-> core requests/responses (pure functions, no aiohttp).

A request is a flat JSON object: each top-level key (and each key of a nested ``parameters`` object)
that names a model input becomes that input, a scalar or a flat list shaped to the input's metadata
shape (Triton's two passes: fixed dimensions divide the element count, the innermost variable one
takes the rest, any other variable one is 1); every other key becomes a request parameter (string,
integer, boolean or number). ``id`` is also the request's id.

A response is one flat JSON object: ``id`` (when the request had one), ``model_name``,
``model_version``, each response parameter, and each output by name, one element as a JSON scalar and
more as a flat list. When names collide the first of those wins, as in Triton.

A response's text is written in pieces joined once, a large tensor's in chunks that let the event loop in
(``appliance.rest.codec.json_numbers``), and a large response is encoded on a worker thread
(``encode_generate_answer``, by the off-loop rule of ``appliance.protocol.inference.decode_off_loop``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from appliance.core.errors import InferenceFailed, InvalidInput
from appliance.core.tensors import element_size, is_bf16
from appliance.engine.signature import ModelSignature
from appliance.engine.tensor_checks import BYTES_ELEMENT_OVERHEAD, DecodeLimits
from appliance.engine.types import InferInput, InferOutput, InferRequest, InferResponse
from appliance.protocol.inference import decode_off_loop, tensor_work
from appliance.rest.codec import (
    decode_json_data,
    json_numbers,
    json_type_words,
    non_finite_token,
    output_text,
    parse_json_object,
)

__all__ = ["decode_generate_request", "encode_generate_answer", "encode_generate_response", "generate_work",
           "sse_event"]

_NESTED = "parameters"


def _ignore(size: int) -> None:
    pass


def _shape(name: str, metadata_shape: list[int], count: int) -> tuple[int, ...]:
    """The input's shape for ``count`` elements (Triton's ExactMappingInput)."""
    error = InvalidInput(f"The schema can not convert input '{name}' to tensor with proper shape")
    remaining = count
    for dim in reversed(metadata_shape):
        if dim != -1:
            if dim == 0 or remaining % dim:
                if dim == 0 and remaining == 0:
                    continue
                raise error
            remaining //= dim
    shape = list(metadata_shape)
    for index in reversed(range(len(shape))):
        if shape[index] == -1:
            shape[index], remaining = remaining, 1
    if remaining != 1 and not (count == 0 and math.prod(shape) == 0):
        raise error
    return tuple(shape)


def _parameter(name: str, value: Any) -> Any:
    if isinstance(value, (str, bool, int, float)):
        return value
    raise InvalidInput(f"parameter '{name[:255]}' has invalid type. It should be either 'int', 'bool', or 'string'.")


class _Decoder:
    def __init__(self, signature: ModelSignature, limits: DecodeLimits, reserve: Callable[[int], None],
                 json_bytes: int) -> None:
        self.signature = signature
        self.limits = limits
        self.reserve = reserve
        self.json_bytes = json_bytes
        self.inputs: list[InferInput] = []
        self.parameters: dict[str, Any] = {}

    def members(self, document: dict[str, Any], nested: bool) -> None:
        for key, value in document.items():
            if key == _NESTED and not nested:
                if key in self.signature.inputs:
                    raise InvalidInput(f"Keyword '{key}' for nested schema also given as input tensor name")
                if not isinstance(value, dict):
                    raise InvalidInput(f"Expected JSON object for keyword: '{key}'")
                try:
                    self.members(value, nested=True)
                except InvalidInput as exc:  # Triton's words for what is wrong inside the nested object
                    if type(exc) is not InvalidInput:
                        raise
                    raise InvalidInput(f"Converting keyword: '{key}': {exc.message}") from None
            elif key in self.signature.inputs:
                self.tensor(key, value)
            else:
                self.parameters[key] = _parameter(key, value)

    def tensor(self, name: str, value: Any) -> None:
        if any(t.name == name for t in self.inputs):
            raise InvalidInput(f"input '{name}' is given twice (at the top level and in 'parameters')")
        if len(self.inputs) >= self.limits.max_inputs:
            raise InvalidInput(f"the request has more than {self.limits.max_inputs} inputs")
        items = value if isinstance(value, list) else [value]
        spec = self.signature.inputs[name]
        if any(isinstance(item, (list, dict)) for item in items):
            raise InvalidInput(f"{json_type_words(spec.datatype)}: input '{name}': generate takes a value or a flat "
                               "list of values")
        if len(items) > self.limits.max_tensor_elements:
            raise InvalidInput(
                f"input '{name}' has {len(items)} elements; at most {self.limits.max_tensor_elements} are allowed")
        shape = _shape(name, self.signature.full_shape(spec), len(items))
        itemsize = element_size(spec.datatype)
        self.reserve(min(len(items), self.json_bytes) * (BYTES_ELEMENT_OVERHEAD if itemsize is None else itemsize))
        self.inputs.append(InferInput(name, spec.datatype, decode_json_data(items, spec.datatype, shape, len(items),
                                                                             name)))


def _repeated_input(body: bytes, signature: ModelSignature) -> str | None:
    """The first model input a generate body names twice (at the top level or in its ``parameters``).

    orjson keeps the last of repeated keys; Triton turns every member into an input, so a repeated input
    name is refused there. Only bodies where some input name occurs twice in the text are looked at again
    (with the standard parser, which reports every pair)."""
    names = [name for name in signature.inputs if body.count(orjson.dumps(name)) > 1]
    if not names:
        return None
    found: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in items:  # Triton adds the members in order: the first one repeated is refused
            if key in seen and key in names:
                found.append(key)
                break
            seen.add(key)
        return dict(items)

    try:
        json.loads(body, object_pairs_hook=pairs)
    except ValueError:
        return None  # orjson took it: a difference of parsers is not this request's fault
    return found[0] if found else None


def decode_generate_request(body: bytes, signature: ModelSignature, limits: DecodeLimits,
                            reserve: Callable[[int], None] = _ignore) -> InferRequest:
    """A generate body as an inference request for a model with ``signature`` (an empty body is {})."""
    document = parse_json_object(body, "a JSON object of inputs and parameters") if body.strip() else {}
    repeated = _repeated_input(body, signature)
    if repeated is not None:  # Triton's words
        raise InvalidInput(f"[request id: <id_unknown>] input '{repeated}' already exists in request")
    request_id = document.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput("Unable to parse 'id': it must be a string")
    decoder = _Decoder(signature, limits, reserve, len(body))
    decoder.members(document, nested=False)
    return InferRequest(decoder.inputs, [], request_id, decoder.parameters)


_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY

_CHUNK = 1 << 16
"""BYTES elements written by one orjson call (orjson holds the GIL for a whole call)."""

_JSON_NUMBER_BYTES = 25
"""The most text one number takes (``-1.7976931348623157e+308`` and its comma)."""


def _refuse_bf16(name: str, data: np.ndarray) -> None:
    if is_bf16(data.dtype):
        raise InvalidInput(f"sending BF16 data via JSON is not supported. Please use the binary data format for output "
                           f"('{name}': generate answers in JSON only; call infer and ask for binary outputs)")


def _value(name: str, data: np.ndarray) -> Any:
    """One element's value for orjson (a tensor of one element is written as a JSON scalar)."""
    if data.dtype == object:
        return output_text(name, data.item(0))
    value = data.item(0)  # a Python number, as tolist() gives it
    if isinstance(value, float) and not math.isfinite(value):  # written as Triton writes them
        return orjson.Fragment(non_finite_token(value))
    return value


def _values(name: str, data: np.ndarray) -> list[bytes]:
    """A tensor's elements as a JSON array, in pieces for one join; no Python step per number.

    Floating-point values are written as Python's floats (double precision, shortest text), as
    ``tolist()`` gives them, not as the narrower type's shortest text."""
    flat = data.ravel()
    if data.dtype == object:
        pieces = [b"["]
        for start in range(0, flat.size, _CHUNK):
            if start:
                pieces.append(b",")
            pieces.append(orjson.dumps([output_text(name, item) for item in flat[start:start + _CHUNK]])[1:-1])
        pieces.append(b"]")
        return pieces
    if flat.dtype.kind == "f":
        flat = flat.astype(np.float64)  # numpy lets the GIL go while it converts
    elif not flat.dtype.isnative:
        flat = flat.astype(flat.dtype.newbyteorder("="))  # orjson writes native-endian arrays only
    return json_numbers(flat)


def _member(key: str, value: Any) -> bytes:
    """``"key":value`` as orjson writes it inside an object."""
    return orjson.dumps({key: value}, option=_OPTIONS)[1:-1]


def _document(response: InferResponse) -> list[bytes]:
    """One response's flat JSON object, keys sorted, in pieces."""
    for output in response.outputs:
        _refuse_bf16(output.name, output.data)
    # Which value each key ends up with: the outputs, overwritten by the parameters, then the model's name,
    # version and the id (as one dict updated in that order).
    members: dict[str, Any] = {output.name: output for output in response.outputs}
    members.update(response.parameters)
    members["model_name"] = response.model_name
    members["model_version"] = str(response.model_version)
    if response.id:
        members["id"] = response.id
    if not all(isinstance(key, str) for key in members):
        orjson.dumps(dict.fromkeys(members))  # raises what orjson raises for such a key
    pieces = [b"{"]
    for key in sorted(members):
        value = members[key]
        if len(pieces) > 1:
            pieces.append(b",")
        if not isinstance(value, InferOutput):
            pieces.append(_member(key, value))
        elif value.data.size == 1:
            pieces.append(_member(key, _value(key, value.data)))
        else:
            pieces += (orjson.dumps(key), b":", *_values(key, value.data))
    pieces.append(b"}")
    return pieces


def _encoded(response: InferResponse, event: bool) -> bytes:
    try:
        pieces = _document(response)
    except orjson.JSONEncodeError as exc:
        raise InferenceFailed(f"the response of model '{response.model_name}' cannot be written as JSON: {exc}; "
                              "response parameters must be strings, integers, booleans or numbers") from None
    if event:
        return b"".join([b"data: ", *pieces, b"\n\n"])
    return b"".join(pieces)


def encode_generate_response(response: InferResponse) -> bytes:
    """One response as Triton's generate JSON (keys sorted, as Triton writes them)."""
    return _encoded(response, event=False)


def generate_work(response: InferResponse) -> int:
    """The bytes encoding ``response`` works through, at most, for the off-loop rule."""
    return sum(tensor_work(o.data) if o.data.dtype == object else o.data.size * _JSON_NUMBER_BYTES
               for o in response.outputs)


async def encode_generate_answer(response: InferResponse, event: bool = False) -> bytes:
    """``encode_generate_response`` (as a server-sent event with ``event``: ``sse_event`` of it), on a worker
    thread when the response is large (``generate_work``): no response's size stalls the event loop."""
    return await decode_off_loop(generate_work(response), _encoded, response, event)


def sse_event(payload: bytes) -> bytes:
    """One server-sent event holding a JSON document (which never contains a newline)."""
    return b"data: " + payload + b"\n\n"
