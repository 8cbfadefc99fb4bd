"""Sequences, decoupled models over gRPC streams, generate and generate_stream."""

from __future__ import annotations

import json
from dataclasses import replace

from tests.oracle.corpus.case import Case, post
from tests.oracle.corpus.tensors import In, Request
from tests.oracle.wire import Grpc

__all__ = ["decoupled", "generate", "sequences"]


def _step(value: int, sequence_id: int | str, start: bool = False, end: bool = False) -> Request:
    parameters: dict[str, object] = {"sequence_id": sequence_id}
    if start:
        parameters["sequence_start"] = True
    if end:
        parameters["sequence_end"] = True
    return Request("accumulator", [In("INPUT", "INT32", [1, 1], [value])], parameters=parameters)


def sequences() -> list[Case]:
    cases: list[Case] = []
    for transport in ("http", "grpc"):
        for name, sequence_id in (("int", 41 if transport == "http" else 42), ("string", f"walk-{transport}")):
            steps = [("start", _step(5, sequence_id, start=True)), ("middle", _step(3, sequence_id)),
                     ("end", _step(2, sequence_id, end=True)), ("after_end", _step(1, sequence_id))]
            for label, request in steps:
                rendered = request.http() if transport == "http" else request.grpc()
                cases.append(Case(f"{transport}.sequence.{name}.{label}", rendered))
        lonely = _step(1, 99 if transport == "http" else 98)
        cases.append(Case(f"{transport}.sequence.without_start", lonely.http() if transport == "http"
                          else lonely.grpc()))
        zero = _step(1, 0, start=True)
        cases.append(Case(f"{transport}.sequence.id_zero", zero.http() if transport == "http" else zero.grpc()))
    # The same sequence carried over a gRPC stream, as tritonclient's stream examples do.
    stream = [_step(value, 77, start=index == 0, end=index == 2).grpc_message() for index, value in
              enumerate((10, 20, 30))]
    cases.append(Case("grpc.stream.sequence", Grpc("ModelStreamInfer", stream=tuple(stream))))
    return cases


def _repeat(values: list[int], request_id: str = "") -> Request:
    return Request("repeat", [In("IN", "INT32", [len(values)], values)], id=request_id or None)


def decoupled() -> list[Case]:
    def stream(name: str, requests: list[Request], metadata=()) -> Case:
        # Half-closed after the last request: both servers answer what they were sent, then end the stream.
        return Case(f"grpc.stream.{name}", Grpc("ModelStreamInfer", stream=tuple(r.grpc_message() for r in requests),
                                                 metadata=metadata))

    def with_final(request: Request) -> Request:
        return replace(request, parameters={**request.parameters, "triton_enable_empty_final_response": True})

    identity = Request("identity", [In("INPUT0", "FP32", [1, 2], [1.0, 2.0])], id="one")
    fails = Request("fails", [In("INPUT0", "FP32", [1, 1], [1.0])], id="refused")
    raises = Request("fails", [In("INPUT0", "FP32", [1, 1], [-1.0])], id="raised")
    unknown = Request("nope", [In("INPUT0", "FP32", [1, 1], [1.0])], id="unknown")
    wrong = Request("identity", [In("INPUT0", "INT32", [1, 1], [1])], id="wrong")
    return [
        stream("repeat.three", [_repeat([7, 8, 9], "r3")]),
        stream("repeat.none", [_repeat([], "r0")]),
        stream("repeat.two_requests", [_repeat([1], "a"), _repeat([2, 3], "b")]),
        stream("repeat.empty_final", [with_final(_repeat([7, 8], "f2"))]),
        stream("repeat.none_empty_final", [with_final(_repeat([], "f0"))]),
        stream("identity.empty_final", [with_final(identity)]),
        stream("identity", [identity]),
        stream("error.model_response_error", [fails]),
        stream("error.model_raises", [raises]),
        stream("error.unknown_model", [unknown]),
        stream("error.wrong_datatype", [wrong]),
        stream("error.then_success", [fails, identity]),
        stream("grpc_error.model_response_error", [fails], (("triton_grpc_error", "true"),)),
        stream("grpc_error.unknown_model", [unknown], (("triton_grpc_error", "true"),)),
        stream("grpc_error.success", [identity], (("triton_grpc_error", "true"),)),
    ]


def generate() -> list[Case]:
    def gen(name: str, model: str, body: object, stream: bool = False, raw: bytes | None = None) -> Case:
        path = f"/v2/models/{model}/generate" + ("_stream" if stream else "")
        return post(f"generate{'_stream' if stream else ''}.{name}", path, body, raw=raw,
                    headers=(("Content-Type", "application/json"),) if raw is not None else ())

    return [
        gen("text", "text", {"text_input": "hello"}),
        gen("text_list", "text", {"text_input": ["hello"]}),
        gen("text_with_parameters", "text", {"text_input": "hello", "parameters": {"colour": "blue"}}),
        gen("identity", "identity", {"INPUT0": [1.0, 2.0]}),
        gen("missing_input", "text", {}),
        gen("unknown_input", "text", {"text_input": "a", "other": 1}),
        gen("wrong_type", "text", {"text_input": 5}),
        gen("nested_object", "text", {"text_input": {"a": 1}}),
        gen("not_object", "text", ["hello"]),
        gen("malformed", "text", None, raw=b"{\"text_input\": "),
        gen("duplicate_key", "text", None, raw=json.dumps({"text_input": "a"})[:-1].encode() + b', "text_input": "b"}'),
        gen("unknown_model", "nope", {"text_input": "hello"}),
        gen("decoupled_several", "repeat", {"IN": [1, 2]}),
        gen("decoupled_none", "repeat", {"IN": []}),
        gen("model_error", "fails", {"INPUT0": [1.0]}),
        gen("model_raises", "fails", {"INPUT0": [-1.0]}),
        gen("text", "text", {"text_input": "hello"}, stream=True),
        gen("repeat", "repeat", {"IN": [4, 5, 6]}, stream=True),
        gen("repeat_none", "repeat", {"IN": []}, stream=True),
        gen("unknown_model", "nope", {"text_input": "hello"}, stream=True),
        gen("missing_input", "text", {}, stream=True),
        gen("model_error", "fails", {"INPUT0": [1.0]}, stream=True),
        gen("model_raises", "fails", {"INPUT0": [-1.0]}, stream=True),
    ]
