"""Requests as bytes on the wire, answers as comparable values: one HTTP call or one gRPC call/stream.

An Answer is what a client can observe: the status (HTTP code, or gRPC code name) and a body made of
plain JSON values (parsed JSON, binary tails in hex, protobuf messages as dicts, stream events as lists).
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message
from tritonclient.grpc import service_pb2_grpc

__all__ = ["Answer", "Grpc", "Http", "Target", "send"]

_TIMEOUT_S = 30


@dataclass(frozen=True)
class Http:
    method: str
    path: str
    body: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Grpc:
    """A unary RPC (``request`` one message) or ModelStreamInfer (``stream`` the messages sent in order)."""

    rpc: str
    request: Message | None = None
    stream: tuple[Message, ...] = ()
    metadata: tuple[tuple[str, str], ...] = ()
    expect_responses: int | None = None
    """For a stream: stop reading after this many responses (else read until the server ends it)."""


@dataclass(frozen=True)
class Target:
    """One server under test: where its HTTP and gRPC ports are."""

    name: str
    http: str
    grpc: str


@dataclass
class Answer:
    status: str
    body: Any
    extra: dict[str, Any] = field(default_factory=dict)
    """What the corpus read after the call (a shared-memory region's bytes)."""

    def as_dict(self) -> dict[str, Any]:
        answer = {"status": self.status, "body": self.body}
        if self.extra:
            answer["extra"] = self.extra
        return answer


def send(request: Http | Grpc, target: Target, channels: dict[str, grpc.Channel]) -> Answer:
    if isinstance(request, Http):
        return _send_http(request, target)
    channel = channels.get(target.grpc)
    if channel is None:
        channel = channels[target.grpc] = grpc.insecure_channel(target.grpc)
    return _send_grpc(request, service_pb2_grpc.GRPCInferenceServiceStub(channel))


def _send_http(request: Http, target: Target) -> Answer:
    host, port = target.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=_TIMEOUT_S)
    try:
        connection.request(request.method, request.path, body=request.body, headers=dict(request.headers))
        response = connection.getresponse()
        payload = response.read()
        headers = {key.lower(): value for key, value in response.getheaders()}
    except (OSError, http.client.HTTPException) as error:
        return Answer("no answer", f"{type(error).__name__}: {error}")
    finally:
        connection.close()
    return Answer(str(response.status), _decode_http_body(payload, headers))


def _decode_http_body(payload: bytes, headers: dict[str, str]) -> Any:
    content_type = headers.get("content-type", "").split(";")[0].strip()
    if "inference-header-content-length" in headers:
        length = int(headers["inference-header-content-length"])
        return {"json": _json_or_text(payload[:length]), "binary": payload[length:].hex()}
    if content_type == "text/event-stream":
        events = []
        for line in payload.decode(errors="replace").splitlines():
            if line.startswith("data:"):
                events.append(_json_or_text(line[5:].strip().encode()))
        return {"events": events}
    if not payload:
        return None
    return _json_or_text(payload)


def _json_or_text(payload: bytes) -> Any:
    try:
        return json.loads(payload)
    except ValueError:
        return {"text": payload.decode(errors="replace")}


def _send_grpc(request: Grpc, stub: service_pb2_grpc.GRPCInferenceServiceStub) -> Answer:
    call: Callable = getattr(stub, request.rpc)
    metadata = request.metadata or None
    if request.rpc != "ModelStreamInfer":
        try:
            response = call(request.request, timeout=_TIMEOUT_S, metadata=metadata)
        except grpc.RpcError as error:
            return Answer(error.code().name, {"message": error.details()})
        return Answer("OK", _message_dict(response))
    return _stream(call, request.stream, metadata, request.expect_responses)


def _stream(call: Callable, messages: Sequence[Message], metadata: Any, expected: int | None) -> Answer:
    # Send every message, then half-close, unless the number of responses is known: then the send side
    # stays open until they came (what tritonclient's stream does), so a server that ends a stream at
    # half-close cannot cut decoupled responses short.
    finished = threading.Event()

    def requests() -> Iterator[Message]:
        yield from messages
        while expected is not None and not finished.is_set():
            finished.wait(0.01)

    responses: list[Any] = []
    status = "OK"
    stream = call(requests(), timeout=_TIMEOUT_S, metadata=metadata)
    ended = False
    try:
        for response in stream:
            responses.append(_message_dict(response))
            if expected is not None and len(responses) >= expected:
                break
        else:
            ended = True
    except grpc.RpcError as error:
        ended = True
        status = error.code().name
        responses.append({"stream_error": error.details()})
    finally:
        finished.set()
        if not ended:  # only a stream cut short: cancelling one that ended has crashed tritonserver 2.51
            stream.cancel()
    return Answer(status, {"responses": responses})


def _message_dict(message: Message) -> Any:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)
