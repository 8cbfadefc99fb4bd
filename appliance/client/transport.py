"""How a pool talks to one box: inference over HTTP or gRPC, and the box's ready models.

Every attempt ends in one of four ways, and only the first two are retried on another box:

- ``Unreachable``: no answer (connection refused, reset or closed before a response): the request
  never produced an answer, so another box may serve it;
- ``Refused``: 503 (the box is full or stopping, with its Retry-After) or a 404 for the model (its
  models changed since the index was read): the box did not run the request;
- a result;
- ``InferenceServerException``: the box answered with an error (4xx, a model error, a timeout while the
  model may be running): raised to the caller, never retried.

HTTP goes through one urllib3 pool per BoxPool (thread-safe, no gevent: tritonclient.http's gevent
client shared between threads deadlocks in the hub), with tritonclient's own request encoder and
result decoder, so inputs, outputs and results are tritonclient.http's. gRPC uses one
tritonclient.grpc client per thread and box.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import urllib3
from tritonclient.utils import InferenceServerException

from appliance.client.boxes import Box
from appliance.client.trust import TokenPolicy

__all__ = ["GrpcTransport", "HttpTransport", "Refused", "Unreachable", "infer_path", "ready_models"]


class Unreachable(Exception):
    def __init__(self, message: str, cool: bool) -> None:
        super().__init__(message)
        self.cool = cool
        """True when no connection could be opened (the box is gone): leave it alone for a while."""


class Refused(Exception):
    def __init__(self, message: str, retry_after: float | None = None, missing: bool = False) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.missing = missing
        """The box has no such model (any more)."""


def infer_path(model: str, version: str) -> str:
    path = f"/v2/models/{quote(model, safe='')}"
    return path + (f"/versions/{quote(version, safe='')}" if version else "") + "/infer"


def ready_models(rows: Any) -> set[str]:
    """Names of the READY models in a repository index answer."""
    if not isinstance(rows, list):
        raise ValueError("the repository index is not a list")
    return {row["name"] for row in rows if isinstance(row, dict) and row.get("state") == "READY"
            and isinstance(row.get("name"), str)}


def error_message(status: int, body: bytes) -> str:
    try:
        payload = json.loads(body)
        if isinstance(payload, dict) and isinstance(payload.get("error"), str):
            return payload["error"]
    except ValueError:
        pass
    return body[:300].decode("utf-8", "replace") or f"HTTP {status}"


def retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def classify_http(status: int, body: bytes, headers: Mapping[str, str], where: str) -> Exception:
    """The error an HTTP answer other than 200 means."""
    message = error_message(status, body)
    if status == 503:
        return Refused(f"{where}: {message}", retry_after(headers.get("Retry-After")))
    if status == 404:
        return Refused(f"{where}: {message}", missing=True)
    return InferenceServerException(msg=message, status=str(status))


def headers_for(token: str | None, extra: Mapping[str, str] | None) -> dict[str, str]:
    headers = dict(extra or {})
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


class HttpTransport:
    """``tokens``: which boxes get the bearer token (none by default)."""

    def __init__(self, timeout: float, tokens: TokenPolicy | None = None, connect_timeout: float = 5.0) -> None:
        self.tokens = tokens or TokenPolicy(None, None, named=True)
        self._http = urllib3.PoolManager(num_pools=64, maxsize=64, retries=False,
                                         timeout=urllib3.Timeout(connect=connect_timeout, read=timeout))

    def request(self, box: Box, method: str, path: str, body: bytes | None = None,
                headers: Mapping[str, str] | None = None) -> urllib3.BaseHTTPResponse:
        try:
            return self._http.request(method, box.base_url + path, body=body,
                                      headers=headers_for(self.tokens.token_for(box), headers))
        except urllib3.exceptions.ReadTimeoutError as exc:  # the model may be running it: not retried
            raise InferenceServerException(msg=f"{box.name}: timed out waiting for the answer ({exc})") from None
        except (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError) as exc:
            raise Unreachable(f"{box.name}: cannot connect ({exc})", cool=True) from None
        except (urllib3.exceptions.ProtocolError, urllib3.exceptions.HTTPError, OSError) as exc:
            raise Unreachable(f"{box.name}: connection lost before an answer ({exc})", cool=False) from None

    def infer(self, box: Box, model: str, inputs: Sequence[Any], options: dict[str, Any]) -> Any:
        import tritonclient.http as triton_http

        body, json_size = triton_http.InferenceServerClient.generate_request_body(
            inputs, outputs=options.get("outputs"), request_id=options.get("request_id", ""),
            priority=options.get("priority", 0), timeout=options.get("timeout"),
            parameters=options.get("parameters"), **sequence_options(options))
        headers = dict(options.get("headers") or {})
        if json_size is not None:
            headers["Inference-Header-Content-Length"] = str(json_size)
            headers["Content-Type"] = "application/octet-stream"
        else:
            headers["Content-Type"] = "application/json"
        headers.setdefault("Accept-Encoding", "identity")  # a LAN: compressing small answers costs more
        response = self.request(box, "POST", infer_path(model, options.get("model_version", "")), body, headers)
        if response.status != 200:
            raise classify_http(response.status, response.data, response.headers, box.name)
        length = response.headers.get("Inference-Header-Content-Length")
        return triton_http.InferResult.from_response_body(
            response.data, header_length=int(length) if length else None,
            content_encoding=None)  # urllib3 decoded it

    def ready_models(self, box: Box) -> set[str]:
        response = self.request(box, "POST", "/v2/repository/index", b'{"ready": true}',
                                {"Content-Type": "application/json"})
        if response.status != 200:
            raise Unreachable(f"{box.name}: repository index: {error_message(response.status, response.data)}",
                              cool=False)
        return ready_models(json.loads(response.data))

    def close(self) -> None:
        self._http.clear()


def classify_grpc(error: InferenceServerException, where: str) -> Exception:
    """UNAVAILABLE: a box that could not be reached (grpc's own words) or that answered 503;
    NOT_FOUND: the model is not on the box. Anything else the box answered: the caller's."""
    status = error.status() or ""
    message = error.message() or ""
    if status == "StatusCode.UNAVAILABLE":
        lowered = message.lower()
        if "failed to connect" in lowered or "connection refused" in lowered:
            return Unreachable(f"{where}: cannot connect ({message})", cool=True)
        if "socket closed" in lowered or "connection reset" in lowered or "broken pipe" in lowered:
            return Unreachable(f"{where}: connection lost before an answer ({message})", cool=False)
        return Refused(f"{where}: {message}", retry_after=1.0)
    if status == "StatusCode.NOT_FOUND":
        return Refused(f"{where}: {message}", missing=True)
    return error


def grpc_options(options: dict[str, Any], timeout: float, token: str | None) -> dict[str, Any]:
    """tritonclient.grpc's infer keywords from the pool's."""
    headers = headers_for(token, options.get("headers"))
    return {"model_version": options.get("model_version", ""), "outputs": options.get("outputs"),
            "request_id": options.get("request_id", ""), "priority": options.get("priority", 0),
            "timeout": options.get("timeout"), "parameters": options.get("parameters"),
            "client_timeout": timeout, "headers": headers or None, **sequence_options(options)}


def sequence_options(options: dict[str, Any]) -> dict[str, Any]:
    """tritonclient's sequence keywords (the same for HTTP and gRPC)."""
    return {"sequence_id": options.get("sequence_id", 0), "sequence_start": bool(options.get("sequence_start")),
            "sequence_end": bool(options.get("sequence_end"))}


class GrpcTransport:
    """tritonclient.grpc clients, one per thread and box (a grpc channel each); ``tokens``: which boxes
    get the bearer token (none by default)."""

    def __init__(self, timeout: float, tokens: TokenPolicy | None = None) -> None:
        self.timeout = timeout
        self.tokens = tokens or TokenPolicy(None, None, named=True)
        self._local = threading.local()
        self._all: list[Any] = []
        self._lock = threading.Lock()

    def _client(self, box: Box) -> Any:
        import tritonclient.grpc as triton_grpc

        clients = self._local.__dict__.setdefault("clients", {})
        url = box.grpc_url
        if url not in clients:
            clients[url] = triton_grpc.InferenceServerClient(url)
            with self._lock:
                self._all.append(clients[url])
        return clients[url]

    def infer(self, box: Box, model: str, inputs: Sequence[Any], options: dict[str, Any]) -> Any:
        try:
            return self._client(box).infer(model, inputs,
                                           **grpc_options(options, self.timeout, self.tokens.token_for(box)))
        except InferenceServerException as exc:
            raise classify_grpc(exc, box.name) from None

    def close(self) -> None:
        with self._lock:
            clients, self._all = self._all, []
        for client in clients:
            try:
                client.close()
            except Exception:  # noqa: BLE001, S110 - closing a channel that is already broken
                pass
