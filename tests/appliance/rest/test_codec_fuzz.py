"""Property-based fuzzing of the KServe v2 HTTP codec (``appliance.rest.codec``, ``appliance.rest.infer_body``).

Requests are built valid (with tritonclient's own encoder), then mutated: bytes truncated, flipped,
inserted or overwritten with length-like numbers; shapes, datatypes, binary_data_size and the
Inference-Header-Content-Length changed. Whatever arrives, the decoder answers with a request or an
``ApplianceError`` a client is blamed for (4xx), allocates no more than a small multiple of the bytes
it received, and hands valid requests back unchanged. Each test runs a fixed, derandomized set of
examples so that CI is reproducible and bounded in time.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from appliance.core.errors import ApplianceError, InvalidInput
from appliance.core.tensors import element_size, encode_bytes_tensor, numpy_dtype
from appliance.engine.tensor_checks import DecodeLimits
from appliance.engine.types import InferOutput, InferRequest, InferResponse, RequestedOutput, SharedMemoryRef
from appliance.protocol.inference import DECODE_OFF_LOOP_BYTES
from appliance.rest import infer_body
from appliance.rest.codec import (
    _NUMPY_RANGE_CHECK,
    decode_infer_request,
    decode_json_data,
    decode_raw_request,
    encode_in_pieces,
    encode_infer_response,
    encoding_work,
    json_numbers,
    non_finite_token,
    parse_json_object,
    plain_answer,
)
from appliance.rest.infer_body import InferBody
from tests.appliance.strategies_fuzz import (
    DATATYPES,
    FEW,
    FIXED_DATATYPES,
    FUZZ,
    HUGE_COUNTS,
    Reservations,
    assert_client_error,
    assert_same_array,
    json_values,
    measure_peak,
    mutated,
    tensors,
)

pytestmark = pytest.mark.timeout(60)  # a hang fails the test instead of stalling CI

# What decoding may allocate per byte received (orjson's objects, then numpy's arrays) plus a constant.
_PER_BYTE = 64
_FIXED = 256 * 1024


@st.composite
def _client_inputs(draw: st.DrawFn, max_inputs: int = 4) -> list[tuple[str, np.ndarray, bool]]:
    """Named tensors, each marked to go as binary data or as JSON (JSON only where it can carry them)."""
    count = draw(st.integers(0, max_inputs))
    out = []
    for index in range(count):
        binary = draw(st.booleans())
        datatype, array = draw(tensors(DATATYPES if binary else tuple(d for d in DATATYPES if d != "BF16"),
                                       finite=not binary, utf8=not binary))
        out.append((f"in{index}", array, binary))
    return out


def _datatype(array: np.ndarray) -> str:
    return "BYTES" if array.dtype == object else httpclient.np_to_triton_dtype(array.dtype)


def _client_body(inputs: list[tuple[str, np.ndarray, bool]], **kwargs: object) -> tuple[bytes, int | None]:
    """The request tritonclient sends for ``inputs``: (body, Inference-Header-Content-Length or None)."""
    client_inputs = []
    for name, array, binary in inputs:
        tensor = httpclient.InferInput(name, list(array.shape), _datatype(array))
        tensor.set_data_from_numpy(array, binary_data=binary)
        client_inputs.append(tensor)
    return httpclient.InferenceServerClient.generate_request_body(client_inputs, **kwargs)


def _decode_or_refuse(body: bytes, header_length: int | None,
                      limits: DecodeLimits = DecodeLimits()) -> tuple[InferRequest | None, Reservations, int]:
    """Decode under tracemalloc; the request (None when refused, with a 4xx ApplianceError), the
    reservations the decoder made and the peak allocation, which stays within a multiple of the body."""
    reserved = Reservations()
    request = None
    with measure_peak() as peak:
        try:
            request = decode_infer_request(body, header_length, limits, reserved)
        except Exception as exc:  # noqa: BLE001 - the property: only the protocol's own errors
            assert_client_error(exc)
    assert peak[0] <= _PER_BYTE * len(body) + _FIXED, f"{peak[0]} bytes allocated for a {len(body)}-byte body"
    assert reserved.total <= _PER_BYTE * len(body) + _FIXED
    if request is not None:
        _check_decoded(request, len(body))
    return request, reserved, peak[0]


def _check_decoded(request: InferRequest, body_size: int) -> None:
    """What a decoded request promises the core: each tensor as declared, no bigger than the body allows."""
    for tensor in request.inputs:
        assert tensor.data.size <= body_size  # an element takes at least a byte of JSON or of binary data
        if tensor.datatype == "BYTES":
            assert all(type(item) is bytes for item in tensor.data.ravel())
        else:
            assert tensor.data.dtype.itemsize == element_size(tensor.datatype)


# Round trips ------------------------------------------------------------------------------------------


@FUZZ
@given(inputs=_client_inputs(), request_id=st.text(max_size=8), priority=st.integers(0, 2**32))
def test_tritonclient_requests_decode_to_the_same_tensors(inputs, request_id, priority):
    body, header_length = _client_body(inputs, request_id=request_id, priority=priority)
    request = decode_infer_request(body, header_length)
    assert [t.name for t in request.inputs] == [name for name, _, _ in inputs]
    for tensor, (_, array, _) in zip(request.inputs, inputs, strict=True):
        assert tensor.datatype == _datatype(array)
        assert_same_array(tensor.data, array)
    assert request.id == (request_id or None)
    assert request.parameters.get("priority", 0) == priority


@pytest.mark.parametrize("data", [[2**63, 0], [0, 2**64 - 1], [[2**63], [1]]])
def test_uint64_json_values_past_int64_beside_small_ones_are_read_exactly(data):
    """Found by the round trip: numpy reads [2**63, 0] as float64, so the UINT64 values tritonclient sends
    as JSON were refused (400 for a valid request)."""
    expected = np.array(data, dtype=np.uint64)
    body = json.dumps({"inputs": [{"name": "x", "datatype": "UINT64", "shape": list(expected.shape), "data": data}]})
    assert_same_array(decode_infer_request(body.encode()).inputs[0].data, expected)


@pytest.mark.parametrize("datatype", ["UINT64", "INT64", "UINT32"])
def test_integers_no_integer_type_holds_together_are_refused_as_out_of_range(datatype):
    body = json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": [2], "data": [2**63, -1]}]})
    with pytest.raises(InvalidInput, match="out of range"):
        decode_infer_request(body.encode())


@FEW
@given(datatype_array=tensors(FIXED_DATATYPES, max_dims=4), data=st.data())
def test_raw_binary_bodies_decode_to_the_same_tensor(datatype_array, data):
    """Triton's raw request (header length 0): the body is the one input, one dimension may be -1."""
    datatype, array = datatype_array
    shape = list(array.shape)
    if shape and all(shape) and data.draw(st.booleans()):
        shape[data.draw(st.integers(0, len(shape) - 1))] = -1
    request = decode_raw_request(array.tobytes(), "x", datatype, tuple(shape))
    (tensor,) = request.inputs
    assert_same_array(tensor.data, array)
    assert request.parameters == {"binary_data_output": True}


# Mutated requests ------------------------------------------------------------------------------------


@FUZZ
@given(inputs=_client_inputs(max_inputs=3), data=st.data())
def test_mutated_bodies_are_decoded_or_refused(inputs, data):
    body, header_length = _client_body(inputs)
    body = data.draw(mutated(body))
    if data.draw(st.booleans()):
        header_length = data.draw(st.none() | st.integers(0, len(body) + 2)
                                  | st.integers(-2, 2).map(lambda d: (header_length or len(body)) + d))
    _decode_or_refuse(body, header_length)


_SHAPES = (st.lists(st.integers(-2, 5), max_size=4) | st.lists(st.sampled_from((0, *HUGE_COUNTS)), min_size=1,
                                                                max_size=4)
           | st.lists(st.integers(0, 2**64), max_size=65) | json_values())
_DATATYPE_VALUES = st.sampled_from([*DATATYPES, "", "fp32", "STRING", "FP8", "INT128", "TYPE_FP32"]) | json_values(2)
_SIZES = (st.integers(-2, 2**64) | st.sampled_from([0, 1, 3, 4, 2**31, 2**32, 2**63]) | json_values(2))


@st.composite
def _mutated_header(draw: st.DrawFn, header: dict) -> dict:
    """The JSON header with one to three fields of its inputs, outputs or parameters changed."""
    header = json.loads(json.dumps(header))
    for _ in range(draw(st.integers(1, 3))):
        inputs = header.get("inputs")
        field = draw(st.sampled_from(("shape", "datatype", "binary_data_size", "data", "name", "parameters",
                                      "shared_memory", "drop", "duplicate", "outputs", "id", "request")))
        if field in ("outputs", "id", "request") or not isinstance(inputs, list) or not inputs:
            if field == "outputs":
                header["outputs"] = draw(json_values() | st.lists(st.fixed_dictionaries(
                    {"name": st.text(max_size=4)}, optional={"parameters": st.dictionaries(
                        st.sampled_from(["binary_data", "classification", "shared_memory_region",
                                         "shared_memory_byte_size"]), json_values(2))}), max_size=3))
            elif field == "id":
                header["id"] = draw(json_values(2))
            else:
                header[draw(st.sampled_from(("inputs", "parameters", "outputs")))] = draw(json_values())
            continue
        index = draw(st.integers(0, len(inputs) - 1))
        tensor = inputs[index]
        if not isinstance(tensor, dict):
            continue
        if field == "shape":
            tensor["shape"] = draw(_SHAPES)
        elif field == "datatype":
            tensor["datatype"] = draw(_DATATYPE_VALUES)
        elif field == "binary_data_size":
            params = tensor.get("parameters")
            if not isinstance(params, dict):
                params = tensor["parameters"] = {}
            params["binary_data_size"] = draw(_SIZES)
        elif field == "data":
            tensor["data"] = draw(json_values() | st.lists(st.integers(-(2**63), 2**64 - 1), max_size=8)
                                  | st.lists(st.floats(allow_nan=False), max_size=8) | st.lists(st.text(max_size=3)))
        elif field == "name":
            tensor["name"] = draw(json_values(2))
        elif field == "parameters":
            tensor["parameters"] = draw(json_values())
        elif field == "shared_memory":
            tensor["parameters"] = draw(st.dictionaries(
                st.sampled_from(["shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"]),
                json_values(2) | st.integers(-1, 2**64)))
        elif field == "drop":
            del inputs[index]
        else:
            inputs.insert(index, json.loads(json.dumps(tensor)))
    return header


@FUZZ
@given(inputs=_client_inputs(max_inputs=3), data=st.data())
def test_requests_with_changed_fields_are_decoded_or_refused(inputs, data):
    body, header_length = _client_body(inputs)
    split = len(body) if header_length is None else header_length
    header = data.draw(_mutated_header(json.loads(body[:split])))
    head = json.dumps(header).encode()
    binary = body[split:]
    if data.draw(st.booleans()):
        binary = data.draw(mutated(binary))
    _decode_or_refuse(head + binary, len(head) if binary or header_length is not None else None)


@FEW
@given(document=json_values(24) | st.fixed_dictionaries({"inputs": st.lists(st.dictionaries(
    st.sampled_from(["name", "shape", "datatype", "data", "parameters"]), json_values(4)), max_size=3)},
    optional={"outputs": json_values(), "parameters": json_values(), "id": json_values(2)}))
def test_any_json_document_is_decoded_or_refused(document):
    _decode_or_refuse(json.dumps(document).encode(), None)


@FEW
@given(body=st.binary(max_size=256), header_length=st.none() | st.integers(0, 300))
def test_random_bytes_are_refused(body, header_length):
    _decode_or_refuse(body, header_length)


# Claims beyond the bytes received ------------------------------------------------------------------


@FUZZ
@given(datatype=st.sampled_from(DATATYPES), count=st.sampled_from(HUGE_COUNTS), dims=st.integers(1, 3),
       payload=st.binary(max_size=64), binary=st.booleans(), limit=st.sampled_from([2**30, 2**40]))
def test_a_shape_claiming_more_than_the_body_holds_is_refused_before_allocation(datatype, count, dims, payload,
                                                                                 binary, limit):
    """A shape of 2**30 (or up to 2**64) elements with a few bytes of data: refused (400) with no buffer
    sized from the claim."""
    shape = [count] + [1] * (dims - 1)
    tensor: dict = {"name": "x", "datatype": datatype, "shape": shape}
    if binary:
        tensor["parameters"] = {"binary_data_size": len(payload)}
    else:
        tensor["data"] = list(payload) if datatype != "BYTES" else [payload.hex()]
    head = json.dumps({"inputs": [tensor]}).encode()
    body = head + (payload if binary else b"")
    request, reserved, peak = _decode_or_refuse(body, len(head) if binary else None, DecodeLimits(limit))
    assert request is None, "a tensor of more elements than the body has bytes was accepted"
    assert peak < _FIXED and reserved.total <= _PER_BYTE * len(body)


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize(("datatype", "shape"), [("FP64", [0, 2**30, 2**30]), ("BYTES", [2**30, 2**30, 0]),
                                                 ("BOOL", [0, 2**30, 2**30, 2**30])])
def test_an_empty_tensor_of_a_shape_numpy_cannot_make_is_a_400(datatype, shape, binary):
    """Found by fuzzing: no elements, yet numpy refused the shape with ValueError (a 500)."""
    tensor: dict = {"name": "x", "datatype": datatype, "shape": shape}
    tensor.update({"parameters": {"binary_data_size": 0}} if binary else {"data": []})
    head = json.dumps({"inputs": [tensor]}).encode()
    with pytest.raises(InvalidInput, match="max_tensor_elements"):
        decode_infer_request(head, len(head) if binary else None)


@FEW
@given(datatype=st.sampled_from(DATATYPES), shape=st.lists(st.sampled_from((-1, 0, 1, 2, *HUGE_COUNTS)), max_size=3),
       body=st.binary(max_size=64), one_element=st.booleans())
def test_raw_binary_bodies_with_any_declared_shape_are_decoded_or_refused(datatype, shape, body, one_element):
    """The declared shape comes from the model's config (``one_element``: its dims are [1], so the shape is
    [1] or, batched, [1, 1]); the body is the client's."""
    if one_element:
        shape = [1] * min(len(shape) + 1, 2)
    reserved = Reservations()
    with measure_peak() as peak:
        try:
            request = decode_raw_request(body, "x", datatype, tuple(shape), DecodeLimits(), reserved, one_element)
        except Exception as exc:  # noqa: BLE001
            assert_client_error(exc)
        else:
            (tensor,) = request.inputs
            if datatype != "BYTES":
                assert tensor.data.tobytes() == body
    assert peak[0] < _FIXED and reserved.total <= _PER_BYTE * len(body) + 64


@FEW
@given(raw=st.none() | st.text(max_size=24) | st.integers(-5, 2**70).map(str)
       | st.sampled_from(["0", " 12 ", "+1", "-0", "1e3", "0x10", "²", "١٢", "9" * 16, "1_000", "12\n"]),
       body=st.binary(max_size=32))
def test_any_header_length_value_is_read_or_refused(raw, body):
    """The Inference-Header-Content-Length header as sent: a count of ASCII digits, or a 400."""
    async def read(account: object) -> bytes:
        return body

    async def receive() -> int | None:
        source = InferBody(lambda: None, raw, read)  # type: ignore[arg-type,return-value]
        try:
            return await source.receive(None)  # type: ignore[arg-type]
        except ApplianceError as exc:
            assert isinstance(exc, InvalidInput)
            return None

    work = asyncio.run(receive())
    assert asyncio.run(receive()) == work  # read again (remembered once read): the same
    digits = raw.strip() if raw is not None else ""
    if raw is None or (digits.isascii() and digits.isdigit() and len(digits) <= 15):
        assert work is not None  # every count of at most 15 ASCII digits is read
    if work is not None:
        assert raw is None or digits.isascii() and digits.isdigit()
        assert 0 <= work <= len(body)


def test_the_header_lengths_remembered_are_bounded():
    for length in range(1000):
        assert infer_body._header_length(f" {length} ") == length
    assert len(infer_body._LENGTHS) <= infer_body._KEPT_LENGTHS
    with pytest.raises(InvalidInput):
        infer_body._header_length("12a")


# Responses the client shapes -------------------------------------------------------------------------


@st.composite
def _outputs(draw: st.DrawFn) -> list[InferOutput]:
    """The model's outputs; some already written into a client's shared-memory region (no data sent)."""
    arrays = draw(st.lists(tensors(DATATYPES), max_size=4))
    return [InferOutput(f"out{i}", datatype, array,
                        SharedMemoryRef("region", array.nbytes) if draw(st.integers(0, 5)) == 0 else None)
            for i, (datatype, array) in enumerate(arrays)]


_BINARY_CHOICE = st.booleans() | json_values(2)


def _sent_as_json_unreadable(output: InferOutput) -> bool:
    """An output JSON cannot carry: BF16, or BYTES that are not UTF-8."""
    if output.datatype != "BYTES":
        return output.datatype == "BF16"
    try:
        for item in output.data.ravel():
            item.decode()
    except UnicodeDecodeError:
        return True
    return False


@FUZZ
@given(outputs=_outputs(), data=st.data())
def test_responses_follow_the_binary_choice_and_tritonclient_reads_them_back(outputs, data):
    """binary_data_output and each output's binary_data, any JSON value the client sends: the response is
    a body tritonclient reads back into the model's outputs, or a 400 where JSON cannot carry one (BF16,
    BYTES that are not UTF-8)."""
    document: dict = {"inputs": []}
    default = data.draw(st.none() | _BINARY_CHOICE)
    if default is not None:
        document["parameters"] = {"binary_data_output": default}
    listed = data.draw(st.lists(st.sampled_from([o.name for o in outputs] or ["none"]), unique=True))
    choices = {name: data.draw(st.none() | _BINARY_CHOICE) for name in listed}
    document["outputs"] = [{"name": name} if choice is None else {"name": name, "parameters": {"binary_data": choice}}
                           for name, choice in choices.items()]
    request = decode_infer_request(json.dumps(document).encode())
    response = InferResponse("m", 1, outputs, id=data.draw(st.none() | st.text(max_size=4)))
    try:
        body, header_length = encode_infer_response(response, request)
    except Exception as exc:  # noqa: BLE001
        assert_client_error(exc)
        assert any(_sent_as_json_unreadable(o) for o in outputs if o.shared_memory is None)
        return
    result = httpclient.InferResult.from_response_body(body, header_length=header_length)
    for output in outputs:
        entry = result.get_output(output.name)
        assert entry is not None and entry["shape"] == list(output.data.shape)
        choice = choices.get(output.name, default)
        if output.shared_memory is not None:  # written into the region: no data, no parameters
            assert "data" not in entry and "parameters" not in entry
            continue
        if type(choice) is bool or choice is None:  # the client's choice, where it made a plain one
            assert ("binary_data_size" in entry.get("parameters", {})) == bool(choice)
        got = result.as_numpy(output.name)
        assert got is not None and got.shape == output.data.shape
        if output.datatype == "BYTES":  # bytes when sent binary, str when sent as JSON
            assert [x.encode() if isinstance(x, str) else bytes(x) for x in got.ravel()] == list(output.data.ravel())
        elif output.data.dtype.kind == "f" and got.dtype == output.data.dtype:  # JSON has one NaN, no payloads
            assert np.array_equal(got, output.data, equal_nan=True)
        else:
            assert_same_array(got, output.data)


_NESTED = st.integers(0, 3000).map(lambda depth: b'{"ready": ' + b"[" * depth + b"]" * depth + b"}")
_DOCUMENTS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=20).map(lambda value: json.dumps(value).encode())


@FUZZ
@given(st.binary(max_size=512) | _NESTED | _DOCUMENTS)
def test_a_control_body_is_an_object_or_a_400_whatever_the_bytes(body):
    """Control bodies (repository index, load, trace and log settings): any bytes, any depth, are a JSON object
    or InvalidInput (a 400 that says what to send), never another error."""
    try:
        document = parse_json_object(body, "an object")
    except InvalidInput as refused:
        assert refused.message
        return
    assert isinstance(document, dict)


# The encoder as it was before it was vectorised (a Python step per element once a value is not finite),
# the reference the vectorised one must match byte for byte.
_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def _reference_numbers(array: np.ndarray) -> bytes:
    flat = np.ascontiguousarray(array).ravel()
    if flat.dtype.kind != "f" or np.isfinite(flat).all():
        return orjson.dumps(flat, option=_NUMPY)
    items = [orjson.dumps(value, option=_NUMPY) if np.isfinite(value) else non_finite_token(float(value))
             for value in flat]
    return b"[" + b",".join(items) + b"]"


def _reference_response(response: InferResponse, request: InferRequest) -> tuple[bytes, int | None]:
    default_binary = bool(request.parameters.get("binary_data_output", False))
    wanted = {o.name: o.parameters for o in request.outputs}
    entries, chunks = [], []
    for output in response.outputs:
        params = wanted.get(output.name)
        binary = default_binary if params is None else bool(params.get("binary_data", False))
        entry: dict = {"name": output.name, "datatype": output.datatype, "shape": list(output.data.shape)}
        if output.shared_memory is not None:
            pass
        elif binary:
            raw = (encode_bytes_tensor(output.data) if output.data.dtype == object
                   else np.ascontiguousarray(output.data).tobytes())
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        elif output.data.dtype == object:
            entry["data"] = [item.decode() for item in output.data.ravel()]
        else:
            entry["data"] = orjson.Fragment(_reference_numbers(output.data))
        entries.append(entry)
    document: dict = {"model_name": response.model_name, "model_version": str(response.model_version)}
    if response.id is not None:
        document["id"] = response.id
    if response.parameters:
        document["parameters"] = response.parameters
    document["outputs"] = entries
    header = orjson.dumps(document, option=_NUMPY)
    if not any(chunks):
        return header, None
    return b"".join([header, *chunks]), len(header)


_WIDTHS = {"FP16": 16, "FP32": 32, "FP64": 64}


@st.composite
def _float_arrays(draw: st.DrawFn) -> np.ndarray:
    """FP16/FP32/FP64 arrays of any values, NaN and infinities often among them (or all of them)."""
    datatype = draw(st.sampled_from(sorted(_WIDTHS)))
    width = _WIDTHS[datatype]
    special = st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0])
    values = st.floats(width=width) | special  # type: ignore[arg-type]
    return draw(hnp.arrays(np.dtype(f"float{width}"), hnp.array_shapes(min_dims=0, max_dims=3, max_side=40),
                           elements=values))


@FUZZ
@given(array=_float_arrays())
def test_json_numbers_writes_non_finite_values_as_the_element_wise_encoder_did(array):
    assert b"".join(json_numbers(array)) == _reference_numbers(array)


@FEW
@given(array=hnp.arrays(st.sampled_from([np.dtype(t) for t in ("bool", "int8", "uint16", "int32", "uint64",
                                                                 "int64")]), hnp.array_shapes(min_dims=0, max_side=8)))
def test_json_numbers_writes_integers_and_booleans_as_orjson_does(array):
    assert b"".join(json_numbers(array)) == _reference_numbers(array)


def test_json_numbers_is_exact_across_chunks():
    """Past 65536 elements the text is written chunk by chunk (the GIL is let go between): non-finite values
    at a chunk's first and last place, and chunks of nothing but them, come out as one array."""
    rng = np.random.default_rng(0)
    array = rng.standard_normal(3 * 65536 + 7).astype(np.float32)
    array[[0, 65535, 65536, 131071, 131072, 131073, -1]] = [np.nan, np.inf, -np.inf, np.nan, np.nan, np.inf, np.nan]
    array[2 * 65536 + 100:3 * 65536 + 50] = np.nan
    assert b"".join(json_numbers(array)) == _reference_numbers(array)


@FUZZ
@given(outputs=_outputs(), data=st.data())
def test_responses_are_byte_identical_to_the_reference_encoder(outputs, data):
    """The body is written in pieces and joined once; it is the same bytes as one orjson document was."""
    outputs = [o for o in outputs if not _sent_as_json_unreadable(o) or o.shared_memory is not None]
    default = data.draw(st.booleans())
    listed = data.draw(st.lists(st.sampled_from([o.name for o in outputs] or ["none"]), unique=True))
    document = {"inputs": [], "parameters": {"binary_data_output": default},
                "outputs": [{"name": name, "parameters": {"binary_data": data.draw(st.booleans())}} for name in listed]}
    request = decode_infer_request(json.dumps(document).encode())
    for output in outputs:  # BF16 goes binary: JSON refuses it
        if output.datatype == "BF16" and output.shared_memory is None:
            request.outputs.append(RequestedOutput(output.name, {"binary_data": True}))
    request.outputs = list({o.name: o for o in request.outputs}.values())
    response = InferResponse("m", 1, outputs, id=data.draw(st.none() | st.text(max_size=4)),
                             parameters=data.draw(st.sampled_from([{}, {"sequence_end": True, "n": 3}])))
    assert encode_infer_response(response, request) == _reference_response(response, request)


@FUZZ
@given(outputs=_outputs(), data=st.data())
def test_an_answer_to_a_request_that_asks_for_nothing_is_the_reference_encoders_too(outputs, data):
    """Where nothing binary is asked for, the common answer is written by one orjson call with the tensors in
    the document; what that call cannot write as the general path does (NaN and infinities, BYTES, shared
    memory, parameters holding null) the general path writes: either way, the same bytes."""
    outputs = [o for o in outputs if not _sent_as_json_unreadable(o) or o.shared_memory is not None]
    response = InferResponse("m", 1, outputs, id=data.draw(st.none() | st.text(max_size=4)),
                             parameters=data.draw(st.sampled_from([{}, {"sequence_end": True, "n": 3}, {"x": None}])))
    plain = decode_infer_request(data.draw(st.sampled_from([  # (parameters that ask nothing binary: a sequence's)
        b'{"inputs": []}', b'{"inputs": [], "parameters": {"sequence_id": 3, "sequence_start": true}}',
        b'{"inputs": [], "parameters": {"binary_data_output": false}}'])))
    assert encode_infer_response(response, plain) == encode_infer_response(response) == _reference_response(
        response, plain)
    assert encode_in_pieces(response, plain) == _reference_response(response, plain)  # the general encoder
    written = plain_answer(response, plain)  # the lane's first try: the same bytes, where it writes them
    assert written is None or (written, None) == _reference_response(response, plain)
    assert written is None or encoding_work(response, plain) <= DECODE_OFF_LOOP_BYTES


_EDGES = (65504.0, 65520.0, 3.4028234663852886e38, 3.4028235677973366e38, 1e39, 1e308)


_NUMBERS = (st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(_EDGES + tuple(-v for v in _EDGES))
            | st.integers(-(2**63), 2**64 - 1))


@given(values=st.lists(_NUMBERS, min_size=1, max_size=6),
       datatype=st.sampled_from(("FP16", "FP32", "FP64")), nested=st.booleans(), long=st.booleans())
def test_json_floats_are_cast_exactly_or_refused_as_beyond_range_flat_or_nested(values, datatype, nested, long):
    """The quick range checks (a short flat list's min and max, the doubles' of a ``long`` one, numpy's
    reductions for a nested one) decide as the cast under np.errstate does: the same tensor, or 'beyond
    range' where the cast made an infinity."""
    if long:
        values = values * (_NUMPY_RANGE_CHECK // len(values) + 1)
    data = [values] if nested else values
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [1, len(values)] if nested else [len(values)],
                                     "datatype": datatype, "data": data}]})
    try:
        source = np.array(data)
    except OverflowError:  # integers numpy reads only as objects: refused as they were
        with pytest.raises(InvalidInput):
            decode_infer_request(body)
        return
    dtype = np.dtype(datatype.replace("FP", "float"))
    with np.errstate(over="ignore"):
        expected = source.astype(dtype)
    try:
        decoded = decode_infer_request(body).inputs[0].data
    except InvalidInput as exc:
        if source.dtype.kind in "iuf":  # (mixed huge integers read as objects: refused for their kind)
            assert f"beyond {datatype}'s range" in str(exc) and not np.isfinite(expected).all()
        return
    assert np.isfinite(decoded).all() and np.array_equal(decoded, expected)


@given(values=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=64),
       datatype=st.sampled_from(sorted(_WIDTHS)), long=st.booleans())
def test_a_flat_list_of_floats_decodes_as_numpy_casts_each_value(values, datatype, long):
    """The flat-float path (its range checked over the list when short, by numpy on the doubles when
    ``long``) makes what casting each JSON value to the datatype makes, and a value past the datatype's
    range is refused, never an infinity."""
    if long:
        values = values * (_NUMPY_RANGE_CHECK // len(values) + 1)
    dtype = np.dtype({"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}[datatype])
    largest = float(np.finfo(dtype).max)
    if max(values) > largest or min(values) < -largest:
        with pytest.raises(InvalidInput, match="beyond"):
            decode_json_data(values, datatype, (len(values),), len(values), "x")
        return
    decoded = decode_json_data(values, datatype, (len(values),), len(values), "x")
    assert decoded.dtype == dtype
    with np.errstate(over="ignore"):
        expected = np.array(values, dtype=dtype)
    assert np.array_equal(decoded, expected)


_INT_TYPES = ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")


@given(data=st.data(), datatype=st.sampled_from(_INT_TYPES), long=st.booleans())
def test_a_flat_list_of_integers_decodes_exactly_or_is_refused_as_out_of_range(data, datatype, long):
    """The flat-integer path (a short list's types, min and max checked in Python) and numpy's general path
    (a ``long`` list) agree: every value within the datatype's range, the same tensor as numpy makes of
    them; one past it (just past either end, or far past), a 400."""
    dtype = numpy_dtype(datatype)
    low, high = int(np.iinfo(dtype).min), int(np.iinfo(dtype).max)
    edges = st.sampled_from([low, high, low - 1, high + 1, 0, -1, 2**64, -(2**63) - 1])
    values = data.draw(st.lists(st.integers(low, high) | edges, min_size=1, max_size=8))
    if long:
        values = values * (_NUMPY_RANGE_CHECK // len(values) + 1)
    if all(low <= value <= high for value in values):
        decoded = decode_json_data(values, datatype, (len(values),), len(values), "x")
        assert decoded.dtype == dtype and decoded.tolist() == values
        return
    with pytest.raises(InvalidInput):
        decode_json_data(values, datatype, (len(values),), len(values), "x")


@given(data=st.data(), datatype=st.sampled_from(("FP16", "FP32", "FP64", "INT32", "INT64")),
       long=st.booleans(), nested=st.booleans())
def test_a_json_boolean_among_numbers_is_refused_wherever_it_stands(data, datatype, long, nested):
    """numpy reads true and false beside numbers as 1 and 0, and Triton refuses a boolean where a number
    belongs: a list with one anywhere (short or ``long``, flat or nested, among zeros and ones or not) is
    refused as holding booleans; the same list without one decodes as numpy casts it."""
    numbers = st.sampled_from([0, 1, 7, -3]) if datatype.startswith("INT") else st.sampled_from(
        [0.0, 1.0, 0.25, -2.5, 0, 1, 3])
    values = data.draw(st.lists(numbers, min_size=1, max_size=8))
    if long:
        values = values * (_NUMPY_RANGE_CHECK // len(values) + 1)
    for flag in data.draw(st.lists(st.booleans(), max_size=2)):
        values.insert(data.draw(st.integers(0, len(values))), flag)
    shape = (1, len(values)) if nested else (len(values),)
    sent = [values] if nested else values
    if any(type(value) is bool for value in values):
        with pytest.raises(InvalidInput, match="got booleans"):
            decode_json_data(sent, datatype, shape, len(values), "x")
        return
    decoded = decode_json_data(sent, datatype, shape, len(values), "x")
    assert decoded.shape == shape and np.array_equal(decoded, np.array(sent, dtype=numpy_dtype(datatype)))


@FUZZ
@given(dims=json_values(3) | st.lists(st.integers(-3, 2**41) | json_values(1), max_size=70),
       datatype=st.sampled_from(DATATYPES))
def test_any_json_shape_is_taken_whole_or_refused_and_a_negative_dimension_in_tritons_words(dims, datatype):
    """Whatever a JSON request declares as a shape: a shape of non-negative integers, or a 400; and a list
    holding a negative integer, whatever else is wrong with it, is refused in the words of Triton's JSON
    reader (the codec asks only of a shape its checks refused)."""
    body = orjson.dumps({"inputs": [{"name": "x", "shape": dims, "datatype": datatype, "data": []}]})
    negative = type(dims) is list and any(type(d) is int and d < 0 for d in dims)
    try:
        decode_infer_request(body, None, DecodeLimits())
    except Exception as exc:  # noqa: BLE001
        assert isinstance(exc, InvalidInput), repr(exc)
        assert_client_error(exc)
        assert ("Unable to parse 'shape'" in str(exc)) == negative, str(exc)
    else:
        assert not negative
