"""Inference over HTTP (JSON and binary) and gRPC: answers, parameters, classification, every error class."""

from __future__ import annotations

import json

from tests.oracle.corpus.case import Case, over_both, post
from tests.oracle.corpus.tensors import In, Out, Request, raw_bytes
from tests.oracle.wire import Grpc, Http

__all__ = ["errors", "inference"]

_A = list(range(16))
_B = [1] * 16


def _identity(data: list | None = None, shape: list[int] | None = None, **options) -> Request:
    data = [1.0, 2.0, 3.0] if data is None else data
    return Request("identity", [In("INPUT0", "FP32", shape or [1, len(data)], data)], **options)


def _add_sub(**options) -> Request:
    return Request("add_sub", [In("INPUT0", "INT32", [1, 16], _A), In("INPUT1", "INT32", [1, 16], _B)], **options)


def inference() -> list[Case]:
    cases: list[Case] = []
    cases += over_both("infer.identity", _identity())
    cases += over_both("infer.identity.batch2", _identity([1.0, 2.0, 3.0, 4.0], [2, 2]))
    cases += over_both("infer.identity.id", _identity(id="request-7"))
    cases += over_both("infer.identity.unknown_parameter", _identity(parameters={"colour": "blue"}))
    cases += over_both("infer.identity.priority", _identity(parameters={"priority": 1}))
    cases += over_both("infer.identity.timeout", _identity(parameters={"timeout": 5_000_000}))
    cases += over_both("infer.identity.version", _identity(version="1"))
    cases += over_both("infer.identity.binary_output", _identity(outputs=[Out("OUTPUT0", binary=True)]))
    cases += over_both("infer.identity.classification", _identity(outputs=[Out("OUTPUT0", classification=2)]))
    cases += over_both("infer.identity.classification_all",
                       _identity(outputs=[Out("OUTPUT0", classification=10)]))
    cases += over_both("infer.identity.classification_binary",
                       _identity(outputs=[Out("OUTPUT0", binary=True, classification=1)]))
    cases += over_both("infer.add_sub", _add_sub())
    cases += over_both("infer.add_sub.one_output", _add_sub(outputs=[Out("OUTPUT1")]))
    cases += over_both("infer.pipeline",
                       Request("pipeline", [In("A", "INT32", [1, 16], _A), In("B", "INT32", [1, 16], _B)]))
    cases += over_both("infer.pipeline.one_output",
                       Request("pipeline", [In("A", "INT32", [1, 16], _A), In("B", "INT32", [1, 16], _B)],
                               outputs=[Out("DIFFERENCE")]))
    cases += over_both("infer.strings", Request("strings", [In("INPUT0", "BYTES", [1, 3], ["a", "bc", ""])]))
    cases += over_both("infer.strings.one", Request("strings", [In("INPUT0", "BYTES", [1, 1], ["427"])]))
    cases += over_both("infer.strings.binary_output",
                       Request("strings", [In("INPUT0", "BYTES", [1, 2], ["x", "yz"])],
                               outputs=[Out("OUTPUT0", binary=True)]))
    cases += over_both("infer.text", Request("text", [In("text_input", "BYTES", [1], ["hello"])]))
    cases += over_both("infer.accumulator.no_sequence",
                       Request("accumulator", [In("INPUT", "INT32", [1, 1], [4])]), binary=False)
    cases += _raw_binary()
    return cases


def _raw_binary() -> list[Case]:
    # Triton's raw binary request: Inference-Header-Content-Length 0, the body is the single input's bytes.
    def raw(name: str, model: str, body: bytes) -> Case:
        return Case(f"http.infer.raw.{name}", Http("POST", f"/v2/models/{model}/infer", body,
                                                   (("Inference-Header-Content-Length", "0"),
                                                    ("Content-Type", "application/octet-stream"))))

    return [
        raw("identity", "identity", raw_bytes("FP32", [1.0, 2.0])),
        raw("strings_one_element", "strings", b"427"),
        raw("text_one_element", "text", b"427"),
        raw("text_prefixed", "text", raw_bytes("BYTES", ["427"])),
        raw("strings_prefixed", "strings", raw_bytes("BYTES", ["427"])),
        raw("two_inputs", "add_sub", raw_bytes("INT32", _A)),
        raw("empty", "identity", b""),
    ]


def errors() -> list[Case]:
    cases: list[Case] = []
    cases += over_both("error.unknown_model", Request("nope", [In("INPUT0", "FP32", [1, 1], [1.0])]), typed=False)
    cases += over_both("error.unknown_version", _identity(version="7"), typed=False)
    cases += over_both("error.bad_version", _identity(version="one"), typed=False)
    cases += over_both("error.missing_input",
                       Request("add_sub", [In("INPUT0", "INT32", [1, 16], _A)]), typed=False)
    cases += over_both("error.unknown_input",
                       Request("identity", [In("INPUT0", "FP32", [1, 1], [1.0]), In("EXTRA", "FP32", [1, 1], [1.0])]),
                       typed=False)
    cases += over_both("error.duplicate_input",
                       Request("identity", [In("INPUT0", "FP32", [1, 1], [1.0]), In("INPUT0", "FP32", [1, 1], [2.0])]),
                       typed=False)
    cases += over_both("error.wrong_datatype", Request("identity", [In("INPUT0", "INT32", [1, 2], [1, 2])]))
    cases += over_both("error.wrong_rank", _identity([1.0, 2.0], [2]), typed=False)
    cases += over_both("error.wrong_dims", Request("add_sub", [In("INPUT0", "INT32", [1, 16], _A),
                                                               In("INPUT1", "INT32", [1, 8], _B[:8])]))
    cases += over_both("error.batch_too_large", _identity([1.0] * 9, [9, 1]), typed=False)
    cases += over_both("error.negative_dim", _identity([1.0], [1, -1]), typed=False)
    cases += over_both("error.element_count", _identity([1.0, 2.0], [1, 3]))
    cases += over_both("error.unknown_output", _identity(outputs=[Out("NOPE")]), typed=False)
    cases += over_both("error.duplicate_output", _add_sub(outputs=[Out("OUTPUT0"), Out("OUTPUT0")]), typed=False)
    cases += over_both("error.classification_zero", _identity(outputs=[Out("OUTPUT0", classification=0)]),
                       typed=False)
    cases += over_both("error.model_response_error", Request("fails", [In("INPUT0", "FP32", [1, 1], [1.0])]),
                       typed=False)
    cases += over_both("error.model_raises", Request("fails", [In("INPUT0", "FP32", [1, 1], [-1.0])]),
                       typed=False)
    cases += over_both("error.decoupled_unary", Request("repeat", [In("IN", "INT32", [2], [1, 2])]), typed=False)
    cases += over_both("error.sequence_without_id", Request("accumulator", [In("INPUT", "INT32", [1, 1], [1])],
                                                             parameters={"sequence_start": True}), binary=False,
                       typed=False)
    cases += over_both("error.bad_priority", _identity(parameters={"priority": "high"}), binary=False, typed=False)
    cases += over_both("error.bad_timeout", _identity(parameters={"timeout": "soon"}), binary=False, typed=False)
    cases += over_both("error.reserved_parameter", _identity(parameters={"triton_final_response": "dummy-value"}),
                       binary=False, typed=False)
    cases += _http_body_errors()
    cases += _grpc_message_errors()
    return cases


def _http_body_errors() -> list[Case]:
    good = _identity().http_json()
    deep: object = ["a"]  # Triton 2.51 takes any nesting (issue 24 thought it stopped at 100)
    for _ in range(120):
        deep = [deep]
    return [
        post("error.json.malformed", "/v2/models/identity/infer", raw=b"{\"inputs\": [", headers=_JSON),
        post("error.json.not_object", "/v2/models/identity/infer", [1, 2]),
        post("error.json.no_inputs", "/v2/models/identity/infer", {"outputs": []}),
        post("error.json.inputs_not_list", "/v2/models/identity/infer", {"inputs": {"name": "INPUT0"}}),
        post("error.json.missing_datatype", "/v2/models/identity/infer",
             {"inputs": [{"name": "INPUT0", "shape": [1, 1], "data": [1.0]}]}),
        post("error.json.missing_shape", "/v2/models/identity/infer",
             {"inputs": [{"name": "INPUT0", "datatype": "FP32", "data": [1.0]}]}),
        post("error.json.missing_data", "/v2/models/identity/infer",
             {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1]}]}),
        post("error.json.string_data", "/v2/models/identity/infer",
             {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": ["one"]}]}),
        post("error.json.unknown_datatype", "/v2/models/identity/infer",
             {"inputs": [{"name": "INPUT0", "datatype": "FP99", "shape": [1, 1], "data": [1.0]}]}),
        post("error.json.nested_data", "/v2/models/identity/infer",
             {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [[1.0, 2.0]]}]}),
        post("json.deep_strings", "/v2/models/strings/infer",
             {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 1], "data": deep}]}),
        post("error.json.duplicate_key", "/v2/models/identity/infer",
             raw=json.dumps(good)[:-1].encode() + b', "inputs": []}', headers=_JSON),
        post("error.binary.size_past_body", "/v2/models/identity/infer",
             raw=_binary_header(4 * 3, 8), headers=_binary_headers(4 * 3)),
        post("error.binary.size_short", "/v2/models/identity/infer",
             raw=_binary_header(4 * 3, 8) + b"\0" * 12, headers=_binary_headers(4 * 3)),
        post("error.binary.header_length_past_body", "/v2/models/identity/infer", raw=b"{}",
             headers=(("Inference-Header-Content-Length", "4096"), ("Content-Type", "application/octet-stream"))),
        post("error.binary.bytes_prefix_past_end", "/v2/models/strings/infer",
             raw=_bytes_header(8) + b"\xff\0\0\0abcd", headers=_binary_headers(len(_bytes_header(8)))),
        post("error.binary.too_many_bytes_elements", "/v2/models/strings/infer",
             raw=_bytes_header(16) + raw_bytes("BYTES", ["a", "b"]) + b"\0\0\0\0\0\0",
             headers=_binary_headers(len(_bytes_header(16)))),
        post("error.binary.too_few_bytes_elements", "/v2/models/strings/infer",
             raw=_bytes_header(5, 3) + raw_bytes("BYTES", ["a"]), headers=_binary_headers(len(_bytes_header(5, 3)))),
    ]


_JSON = (("Content-Type", "application/json"),)


def _binary_header(size: int, elements: int) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, elements],
                                   "parameters": {"binary_data_size": size}}]}).encode()


def _bytes_header(size: int, elements: int = 2) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, elements],
                                   "parameters": {"binary_data_size": size}}]}).encode()


def _binary_headers(length: int) -> tuple[tuple[str, str], ...]:
    return (("Inference-Header-Content-Length", str(length)), ("Content-Type", "application/octet-stream"))


def _grpc_message_errors() -> list[Case]:
    both = _identity().grpc_message(typed=True)
    both.raw_input_contents.append(b"\0" * 12)
    short = _identity().grpc_message()
    short.raw_input_contents[0] = b"\0" * 8
    extra_raw = _identity().grpc_message()
    extra_raw.raw_input_contents.append(b"\0" * 4)
    wrong_contents = _identity().grpc_message(typed=True)
    wrong_contents.inputs[0].contents.ClearField("fp32_contents")
    wrong_contents.inputs[0].contents.int_contents.extend([1, 2, 3])
    no_name = _identity().grpc_message()
    no_name.model_name = ""
    return [
        Case("grpc.error.raw_and_contents", Grpc("ModelInfer", both)),
        Case("grpc.error.raw_size_short", Grpc("ModelInfer", short)),
        Case("grpc.error.raw_count", Grpc("ModelInfer", extra_raw)),
        Case("grpc.error.contents_field", Grpc("ModelInfer", wrong_contents)),
        Case("grpc.error.empty_model_name", Grpc("ModelInfer", no_name)),
    ]
