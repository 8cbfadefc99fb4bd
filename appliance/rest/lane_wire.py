"""The infer lane's wire format: which requests it takes (``parse_head``) and how its answers are written
(status line, fields, body; as aiohttp writes them, without a ``Server`` field). See ``appliance.rest.lane``."""

from __future__ import annotations

import re
import time
from email.utils import formatdate
from http import HTTPStatus

import orjson
from multidict import CIMultiDict

from appliance.errors import ApplianceError
from appliance.protocol.operations import Operation
from appliance.rest.codec import HEADER_LENGTH
from appliance.rest.error_middleware import error_parts, internal_message

__all__ = ["LANE_BODY_BYTES", "LANE_HEAD_BYTES", "LaneHead", "answer", "empty_answer", "error_answer",
           "error_response", "infer_answer", "internal_error", "json_answer", "parse_head"]

LANE_HEAD_BYTES = 16 << 10
"""The largest request head the lane parses; a longer one goes to aiohttp (which answers 431 past its limits)."""
LANE_BODY_BYTES = 64 << 10
"""The largest body the lane collects (after admission; aiohttp's own read buffer holds as much)."""
_WRITE_APART = 1 << 16  # answers with a larger payload are written as two buffers, not joined

_MODEL = rb"/v2/models/([A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,254})(?:/versions/([0-9]{1,18}))?"
_INFER = re.compile(_MODEL + rb"/infer")
_READS = re.compile(rb"/v2/health/(live|ready)|" + _MODEL + rb"(/ready|/config)?")
_READ_OPERATIONS = {b"live": Operation.SERVER_LIVE, b"ready": Operation.SERVER_READY, None: Operation.MODEL_METADATA,
                    b"/ready": Operation.MODEL_READY, b"/config": Operation.MODEL_CONFIG}
# RFC 9110's field: a token, a colon, a value of visible bytes, spaces, tabs and obs-text.
_FIELD = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z\-]+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*")
_NOT_LANE = frozenset((b"transfer-encoding", b"expect", b"upgrade", b"te", b"trailer"))
_HEADER_LENGTH_FIELD = HEADER_LENGTH.encode("ascii") + b": %d\r\n"
_REASONS = {status.value: status.phrase for status in HTTPStatus}


class LaneHead:
    """A lane request's head: the operation it asks for, its method and target as sent, the model (and
    version) it names, its fields, its body's length, and whether the client asked for the connection to
    close after the answer."""

    __slots__ = ("operation", "method", "target", "model", "version", "headers", "length", "close")

    def __init__(self, operation: Operation, method: str, target: str, model: str, version: str | None,
                 headers: CIMultiDict[str], length: int, close: bool) -> None:
        self.operation = operation
        self.method = method
        self.target = target
        self.model = model
        self.version = version
        self.headers = headers
        self.length = length
        self.close = close


def parse_head(head: bytes | bytearray, max_body: int) -> LaneHead | None:
    """The head (without its blank line) of a lane request, or None when it is not one (aiohttp's then).
    Lane requests are infer (POST) and the reads a client makes between inferences (GET: server
    liveness and readiness, a model's readiness, metadata and config)."""
    request_line, *lines = head.split(b"\r\n")
    method, _, rest = request_line.partition(b" ")
    target, _, version = rest.partition(b" ")
    if version != b"HTTP/1.1":
        return None
    if method == b"POST":
        route = _INFER.fullmatch(target)
        if route is None:
            return None
        operation = Operation.INFER
        model, number = route.groups()
    elif method == b"GET":
        route = _READS.fullmatch(target)
        if route is None:
            return None
        health, model, number, suffix = route.groups()
        if model == b"stats" and number is None and suffix is None:  # GET /v2/models/stats: every model's
            return None
        operation = _READ_OPERATIONS[health or suffix]
    else:
        return None
    headers: CIMultiDict[str] = CIMultiDict()
    length: int | None = None
    close = False
    for line in lines:
        field = _FIELD.fullmatch(line)
        if field is None:
            return None
        name, value = field.groups()
        key = name.lower()
        if key in _NOT_LANE:
            return None
        if key == b"content-length":
            if length is not None or not value.isdigit() or len(value) > 12:
                return None
            length = int(value)
        elif key == b"content-encoding":
            if value.lower() != b"identity":
                return None
        elif key == b"accept-encoding":
            if b"gzip" in value.lower() or b"deflate" in value.lower():
                return None
        elif key == b"connection":
            tokens = {token.strip() for token in value.lower().split(b",")}
            if b"upgrade" in tokens:
                return None
            close = b"close" in tokens
        elif key == b"host" and "Host" in headers:
            return None
        headers.add(name.decode("ascii"), value.decode("utf-8", "surrogateescape"))
    if operation is Operation.INFER:
        if length is None or length > max_body:
            return None
    elif length:  # a read with a body: aiohttp's
        return None
    return LaneHead(operation, method.decode("ascii"), target.decode("ascii"),
                    model.decode("ascii") if model else "", number.decode("ascii") if number else None, headers,
                    length or 0, close)


class _Dates:
    """The Date header's value, formatted once a second."""

    __slots__ = ("_second", "_value")

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def now(self) -> bytes:
        second = int(time.time())
        if second != self._second:
            self._second = second
            self._value = formatdate(second, usegmt=True).encode("ascii")
        return self._value


_DATES = _Dates()


def answer(status: int, content_type: bytes, payload: bytes, extra: bytes = b"") -> list[bytes]:
    head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nDate: %s\r\n%s\r\n" % (
        status, _REASONS.get(status, "").encode("ascii"), content_type, len(payload), _DATES.now(), extra)
    if len(payload) > _WRITE_APART:
        return [head, payload]
    return [head + payload]


def empty_answer(status: int) -> list[bytes]:
    """An answer without a body (aiohttp's ``web.Response(status=...)``: no Content-Type either)."""
    return [b"HTTP/1.1 %d %s\r\nContent-Length: 0\r\nDate: %s\r\n\r\n" % (
        status, _REASONS.get(status, "").encode("ascii"), _DATES.now())]


def json_answer(data: object) -> list[bytes]:
    return answer(200, b"application/json", orjson.dumps(data))


def error_response(status: int, message: str, extra: bytes = b"") -> list[bytes]:
    """``{"error": message}`` (aiohttp's routes: ``error_middleware.error_response``)."""
    return answer(status, b"application/json", orjson.dumps({"error": message}), extra)


def error_answer(exc: ApplianceError) -> tuple[list[bytes], bool]:
    """The answer to ``exc``, and whether the connection closes after it."""
    status, message, headers = error_parts(exc)
    extra = b"".join(b"%s: %s\r\n" % (k.encode("ascii"), v.encode("latin-1")) for k, v in (headers or {}).items())
    close = headers is not None and headers.get("Connection") == "close"
    return error_response(status, message, extra), close


def internal_error(exc: Exception) -> list[bytes]:
    return error_response(500, internal_message(exc))


def infer_answer(payload: bytes, json_length: int | None) -> list[bytes]:
    """An infer response: JSON, or a JSON header of ``json_length`` bytes followed by binary tensors."""
    if json_length is None:
        return answer(200, b"application/json", payload)
    return answer(200, b"application/octet-stream", payload, _HEADER_LENGTH_FIELD % json_length)
