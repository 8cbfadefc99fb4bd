"""A named request of the corpus, with what must happen around it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tests.oracle.corpus.tensors import Request
from tests.oracle.wire import Grpc, Http

__all__ = ["Case", "get", "over_both", "post"]


@dataclass(frozen=True)
class Case:
    name: str
    """Unique; ``http.`` or ``grpc.`` first, then the group (``http.infer.identity``)."""
    request: Http | Grpc
    before: Callable[[], None] | None = None
    """Run before each server gets the request (e.g. clear an output region)."""
    after: Callable[[], dict[str, Any]] | None = None
    """Run after each answer; what it returns is compared too (e.g. an output region's bytes)."""
    counted: str | None = None
    """After the answer, wait until this model's statistics show an execution and have stopped changing
    (Triton counts a request once it is released, a moment after its answer went: a decoupled request after
    its stream ended, a failed one after its error)."""
    settle: bool = False
    """After the answer, wait until the server's repository index shows no model LOADING or UNLOADING
    (Triton unloads in the background after answering)."""


def get(name: str, path: str) -> Case:
    return Case(f"http.{name}", Http("GET", path))


def post(name: str, path: str, body: Any = None, raw: bytes | None = None,
         headers: tuple[tuple[str, str], ...] = ()) -> Case:
    """POST JSON (``body``) or exact bytes (``raw``)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
    content_type = (("Content-Type", "application/json"),) if raw is None else ()
    return Case(f"http.{name}", Http("POST", path, data, (*content_type, *headers)))


def over_both(name: str, request: Request, binary: bool = True, typed: bool = True) -> list[Case]:
    """One inference over HTTP JSON, HTTP with binary tails, gRPC raw contents and gRPC typed contents."""
    cases = [Case(f"http.{name}", request.http()), Case(f"grpc.{name}", request.grpc())]
    if binary and any(tensor.data is not None for tensor in request.inputs):
        binary_request = replace(request, inputs=[replace(tensor, binary=tensor.data is not None)
                                                  for tensor in request.inputs])
        cases.append(Case(f"http.{name}.binary", binary_request.http()))
    if typed and any(tensor.data is not None for tensor in request.inputs):
        cases.append(Case(f"grpc.{name}.typed", request.grpc(typed=True)))
    return cases
