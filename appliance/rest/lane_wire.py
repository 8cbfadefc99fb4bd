"""The infer lane's wire format: which requests it takes (``lane_request``, over a head ``HeadReader`` read)
and how its answers are written (status line, fields, body; as aiohttp writes them, without a ``Server``
field; ``closing`` adds ``Connection: close`` to an answer after which the connection closes). See
``appliance.rest.lane``."""

from __future__ import annotations

import re
import time
from email.utils import formatdate
from http import HTTPStatus

import orjson
from multidict import CIMultiDict

from appliance.core.errors import ApplianceError, internal_message
from appliance.protocol.admission import Caller
from appliance.protocol.inference import Target
from appliance.protocol.operations import Operation
from appliance.rest.binary_header import KnownHeader
from appliance.rest.http_basics import HEADER_LENGTH, error_parts
from appliance.rest.lane_head import HeadReader

__all__ = ["LANE_BODY_BYTES", "LaneHead", "answer", "closing", "empty_answer", "error_answer", "error_response",
           "infer_answer", "internal_error", "json_answer", "lane_request"]

LANE_BODY_BYTES = 64 << 10
"""The largest body the lane collects (after admission; aiohttp's own read buffer holds as much)."""
_WRITE_APART = 1 << 16  # answers with a larger payload are written as two buffers, not joined

_MODEL = rb"/v2/models/([A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,254})(?:/versions/([0-9]{1,18}))?"
_INFER = re.compile(_MODEL + rb"/infer")
_READS = re.compile(rb"/v2/health/(live|ready)|" + _MODEL + rb"(/ready|/config)?")
_READ_OPERATIONS = {b"live": Operation.SERVER_LIVE, b"ready": Operation.SERVER_READY, None: Operation.MODEL_METADATA,
                    b"/ready": Operation.MODEL_READY, b"/config": Operation.MODEL_CONFIG}
# Fields that make a request aiohttp's (a body framed otherwise, an interim answer, another protocol).
_NOT_LANE = frozenset((b"transfer-encoding", b"expect", b"upgrade", b"te", b"trailer"))
_HEADER_LENGTH_FIELD = HEADER_LENGTH.encode("ascii") + b": %d\r\n"
_STATUS_LINES = {status.value: b"HTTP/1.1 %d %s\r\n" % (status.value, status.phrase.encode("ascii"))
                 for status in HTTPStatus}
_CLOSE = b"Connection: close\r\n"


class LaneHead:
    """A lane request's head: the operation it asks for, its method and target as sent, the model (and
    version) it names, its fields, its body's length, and whether the client asked for the connection to
    close after the answer. A connection whose next head is byte for byte the last one reuses it (what
    is read from a head depends on its bytes alone), or one made from it with other lengths (``resized``);
    ``caller``: its client as the Host rule and the connection's addresses made it, kept with it for that
    reuse (None until then)."""

    __slots__ = ("operation", "method", "target", "model", "version", "headers", "length", "close", "caller",
                 "named", "proof", "binary")

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
        self.caller: Caller | None = None
        self.named: Target | None = None
        """The model it names, as the data plane takes it (made once, then kept with it)."""
        self.proof: object = None
        """Its access check passed (``Admitted.proof``), kept with it for that reuse."""
        self.binary: KnownHeader | None = None
        """The last JSON header of the binary requests sent with it (``appliance.rest.binary_header``)."""

    def resized(self, headers: CIMultiDict[str], length: int) -> LaneHead:
        """This head as another request sends it with other lengths (``headers``: its fields with their new
        values, ``length``: its body's): the same operation, target and client (what was made of them is
        kept, as for a head sent again)."""
        head = LaneHead(self.operation, self.method, self.target, self.model, self.version, headers, length,
                        self.close)
        head.caller, head.named, head.proof, head.binary = self.caller, self.named, self.proof, self.binary
        return head

    def known_header(self) -> KnownHeader:
        """``binary``, made on first use."""
        known = self.binary
        if known is None:
            known = self.binary = KnownHeader()
        return known


def lane_request(head: HeadReader, max_body: int) -> LaneHead | None:
    """The lane request ``head`` (complete, as llhttp read it) asks for, or None when it is not one
    (aiohttp's then). Lane requests are infer (POST) and the reads a client makes between inferences (GET:
    server liveness and readiness, a model's readiness, metadata and config)."""
    if head.version != "1.1" or head.upgrade:
        return None
    method, target = head.method, head.target
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
    noted = head.noted
    if not _NOT_LANE.isdisjoint(noted):
        return None
    coding = noted.get(b"content-encoding")
    if coding is not None and coding.strip().lower() != b"identity":
        return None
    accepted = noted.get(b"accept-encoding")
    if accepted is not None and (b"gzip" in accepted.lower() or b"deflate" in accepted.lower()):
        return None
    connection = noted.get(b"connection")
    if connection is not None and b"upgrade" in connection.lower():  # llhttp's upgrade flag wants Upgrade too
        return None
    length = noted.get(b"content-length", b"")  # llhttp took at most one, of digits
    if operation is Operation.INFER:
        if not length.strip().isdigit() or len(length) > 12 or int(length) > max_body:
            return None
    elif length.strip(b"0 \t"):  # a read with a body: aiohttp's
        return None
    return LaneHead(operation, method.decode("ascii"), target.decode("ascii"),
                    model.decode("ascii") if model else "", number.decode("ascii") if number else None,
                    head.headers, int(length) if length else 0, not head.keep_alive)


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


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    return line if line is not None else b"HTTP/1.1 %d \r\n" % status


def answer(status: int, content_type: bytes, payload: bytes, extra: bytes = b"") -> list[bytes]:
    head = b"%sContent-Type: %s\r\nContent-Length: %d\r\nDate: %s\r\n%s\r\n" % (
        _status_line(status), content_type, len(payload), _DATES.now(), extra)
    if len(payload) > _WRITE_APART:
        return [head, payload]
    return [head + payload]


def empty_answer(status: int) -> list[bytes]:
    """An answer without a body (aiohttp's ``web.Response(status=...)``: no Content-Type either)."""
    return [b"%sContent-Length: 0\r\nDate: %s\r\n\r\n" % (_status_line(status), _DATES.now())]


def json_answer(data: object) -> list[bytes]:
    return answer(200, b"application/json", orjson.dumps(data))


def error_response(status: int, message: str, extra: bytes = b"") -> list[bytes]:
    """``{"error": message}`` (aiohttp's routes: ``error_middleware.error_response``)."""
    return answer(status, b"application/json", orjson.dumps({"error": message}), extra)


def error_answer(exc: ApplianceError) -> tuple[list[bytes], bool]:
    """The answer to ``exc`` (without ``Connection``: see ``closing``), and whether the connection closes
    after it."""
    status, message, headers = error_parts(exc)
    close = False
    extra = b""
    for name, value in (headers or {}).items():
        if name == "Connection":
            close = value == "close"
        else:
            extra += b"%s: %s\r\n" % (name.encode("ascii"), value.encode("latin-1"))
    return error_response(status, message, extra), close


def closing(reply: list[bytes]) -> list[bytes]:
    """``reply`` (an answer written here) with ``Connection: close``: the connection closes after it."""
    first = reply[0]
    cut = first.index(b"\r\n") + 2  # after the status line
    return [first[:cut] + _CLOSE + first[cut:], *reply[1:]]


def internal_error(exc: Exception) -> list[bytes]:
    return error_response(500, internal_message(exc))


def infer_answer(payload: bytes, json_length: int | None) -> list[bytes]:
    """An infer response: JSON, or a JSON header of ``json_length`` bytes followed by binary tensors."""
    if json_length is None:
        return answer(200, b"application/json", payload)
    return answer(200, b"application/octet-stream", payload, _HEADER_LENGTH_FIELD % json_length)
