"""Reading one HTTP/1.1 request head for the infer lane with ``httptools`` (llhttp, the parser uvicorn and
Node.js use), within the lane's bounds.

llhttp does the parsing: the request line, each field (a token name, a colon, a value without control
bytes), CRLF line endings (a bare LF is refused at once, not waited on), no folded lines, one
``Content-Length`` of digits, no ``Content-Length`` beside ``Transfer-Encoding``. A ``HeadReader`` adds
what llhttp leaves to the server: bounds on a line (``LANE_LINE_BYTES``), on the whole head
(``LANE_HEAD_BYTES``) and on the number of fields (``LANE_MAX_FIELDS``), and HTTP/1.1's ``Host`` rule
(exactly one). It never feeds llhttp a byte past the head's blank line, so the head's length is known
exactly: a request the lane does not take goes to aiohttp with every byte the client sent for it, and
no body is ever framed by two parsers. What breaks a rule raises ``HeadRefused``: the lane answers it
with its status and ``{"error": ...}`` and closes the connection.
"""

from __future__ import annotations

from http import HTTPStatus

from httptools import HttpParserCallbackError, HttpParserError, HttpParserUpgrade, HttpRequestParser
from multidict import CIMultiDict

__all__ = ["LANE_HEAD_BYTES", "LANE_LINE_BYTES", "LANE_MAX_FIELDS", "HeadReader", "HeadRefused"]

LANE_HEAD_BYTES = 32 << 10
"""The largest request head read (the request line, fields and blank line, as nginx's default 4 x 8 KiB)."""
LANE_LINE_BYTES = 8 << 10
"""The longest request line or field line (aiohttp's and nginx's bound)."""
LANE_MAX_FIELDS = 100
"""The most field lines in one head (Apache's LimitRequestFields)."""

_NOTED = frozenset((b"host", b"content-length", b"content-encoding", b"accept-encoding", b"connection",
                    b"transfer-encoding", b"expect", b"upgrade", b"te", b"trailer"))
_END = b"\r\n\r\n"
_BLANK_RUNS = 3  # empty lines before a request line that are skipped (RFC 9112 2.2: at least one)


class HeadRefused(Exception):
    """A request head the lane refuses: ``status`` (4xx) and a message that says how to fix it."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _refusal(exc: HttpParserError) -> HeadRefused:
    """What llhttp's error says of the head (a callback's own refusal, or the head's fault)."""
    if isinstance(exc, HttpParserCallbackError) and isinstance(exc.__context__, HeadRefused):
        return exc.__context__
    return HeadRefused(HTTPStatus.BAD_REQUEST,
                       f"malformed HTTP/1.1 request head: {exc}; send a request line, then 'Name: value' fields, "
                       "each line ending in CRLF, then an empty line")


def _too_long(what: str) -> HeadRefused:
    return HeadRefused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                       f"{what}; send fields of at most {LANE_LINE_BYTES} bytes each, at most {LANE_MAX_FIELDS} of "
                       f"them, in a head of at most {LANE_HEAD_BYTES} bytes")


class HeadReader:
    """One request head, fed as its bytes arrive (``feed``); llhttp's callbacks collect it. Once complete:
    ``method``, ``target``, ``version`` ("1.1"), ``headers`` (values decoded as UTF-8 with surrogate
    escapes, as aiohttp does), ``keep_alive`` (llhttp's reading of ``Connection`` and the version) and
    ``upgrade`` (an ``Upgrade`` or ``CONNECT`` request). ``noted``: the raw values of the fields that decide
    whether a request is the lane's (lower-case names; a repeated field's values joined by ", ")."""

    __slots__ = ("_parser", "_fed", "_begun", "_blank_runs", "method", "target", "version", "headers", "noted",
                 "keep_alive", "upgrade")

    method: bytes
    keep_alive: bool
    upgrade: bool

    def __init__(self) -> None:
        self._parser = HttpRequestParser(self)
        # RFC 9112 6.3: Transfer-Encoding overrides a Content-Length sent with it (Python's requests sends
        # both when told to chunk a body it has whole, as Triton's qa test_content_encoding_chunked_manually
        # does); the lane never serves such a request: it hands it over without the Content-Length and with
        # "Connection: close" (``normalised``), so no second request can follow on that connection.
        self._parser.set_dangerous_leniencies(lenient_chunked_length=True)
        self._fed = 0  # bytes of the head llhttp has read
        self._begun = False
        self._blank_runs = 0
        self.target = b""
        self.version = ""  # set once the head is complete
        self.headers: CIMultiDict[str] = CIMultiDict()
        self.noted: dict[bytes, bytes] = {}

    def feed(self, buffer: bytearray) -> int:
        """Read what ``buffer`` (the connection's bytes from the head's first one) holds beyond what was
        read before; the head's length once it is complete, else 0. Raises ``HeadRefused``."""
        fed = self._fed
        while True:
            end = buffer.find(_END, fed - 3 if fed > 3 else 0, LANE_HEAD_BYTES)
            stop = end + 4 if end >= 0 else min(len(buffer), LANE_HEAD_BYTES)
            if stop > fed:
                try:
                    self._parser.feed_data(buffer[fed:stop])
                except HttpParserUpgrade:
                    pass  # an Upgrade or CONNECT request, complete: never the lane's
                except HttpParserError as exc:
                    raise _refusal(exc) from None
                fed = self._fed = stop
            if self.version:  # complete
                return stop
            if end < 0:
                break
            # A blank line before the request line (llhttp skips those): the head is further on.
            self._blank_runs += 1
            if self._blank_runs > _BLANK_RUNS:
                raise HeadRefused(HTTPStatus.BAD_REQUEST, "too many empty lines before the request line; start the "
                                                          "request with its request line")
        if len(buffer) >= LANE_HEAD_BYTES:
            raise _too_long(f"the request head is over {LANE_HEAD_BYTES} bytes")
        line = fed - buffer.rfind(b"\n", 0, fed) - 1  # the line still coming
        if line > LANE_LINE_BYTES:
            raise _too_long(f"a line of the request head is over {LANE_LINE_BYTES} bytes")
        return 0

    # llhttp's callbacks (httptools calls them while ``feed_data`` runs)

    def on_message_begin(self) -> None:
        if self._begun:  # llhttp read past the head's blank line: never, as fed (this keeps it so)
            raise HeadRefused(HTTPStatus.BAD_REQUEST, "a second request began inside the first one's head")
        self._begun = True

    def on_url(self, url: bytes) -> None:
        url = self.target = self.target + url if self.target else url
        if len(url) > LANE_LINE_BYTES:
            raise HeadRefused(HTTPStatus.REQUEST_URI_TOO_LONG,
                              f"the request target is over {LANE_LINE_BYTES} bytes; send a shorter one")

    def on_header(self, name: bytes, value: bytes) -> None:
        headers = self.headers
        if len(name) + len(value) > LANE_LINE_BYTES or len(headers) >= LANE_MAX_FIELDS:
            raise _too_long(f"the field {name[:40].decode('latin-1')!r} is over {LANE_LINE_BYTES} bytes"
                            if len(headers) < LANE_MAX_FIELDS else
                            f"the request head has more than {LANE_MAX_FIELDS} fields")
        key = name.lower()
        if key in _NOTED:
            noted = self.noted
            if key in noted:
                if key == b"host":  # RFC 9112 3.2
                    raise HeadRefused(HTTPStatus.BAD_REQUEST, "the request has more than one Host header; send one")
                noted[key] += b", " + value
            else:
                noted[key] = value
        # llhttp leaves a value's trailing whitespace on it (RFC 9110 5.5: not part of the value).
        headers.add(name.decode("latin-1"), value.rstrip(b" \t").decode("utf-8", "surrogateescape"))

    def on_headers_complete(self) -> None:
        parser = self._parser
        version = parser.get_http_version()
        if b"host" not in self.noted and version == "1.1":  # RFC 9112 3.2
            raise HeadRefused(HTTPStatus.BAD_REQUEST, "an HTTP/1.1 request needs a Host header; send "
                                                      "'Host: <this appliance's address>'")
        self.method = parser.get_method()
        # Read here: llhttp forgets both once the message is complete (a request without a body is at once).
        self.keep_alive = parser.should_keep_alive()
        self.upgrade = parser.should_upgrade()
        self.version = version

    @property
    def chunked_with_length(self) -> bool:
        """Both Transfer-Encoding and Content-Length came (see ``normalised``)."""
        return b"transfer-encoding" in self.noted and b"content-length" in self.noted

    def normalised(self, head: bytes) -> bytes:
        """``head`` (this request's head, to its blank line) as RFC 9112 6.3 reads it: without its
        Content-Length, and with ``Connection: close`` (the connection ends after the answer)."""
        lines = [line for line in head[:-4].split(b"\r\n") if not line.lower().startswith(b"content-length:")]
        return b"\r\n".join([*lines, b"Connection: close"]) + _END

    def on_body(self, body: bytes) -> None:
        raise HeadRefused(HTTPStatus.BAD_REQUEST, "the request head ended before its blank line")

    def on_chunk_header(self) -> None:
        raise HeadRefused(HTTPStatus.BAD_REQUEST, "the request head ended before its blank line")
