"""The last lane head a connection read, to take its next request's head without parsing it again
(``KnownHead``): clients repeat their heads, byte for byte, or but for the digits of ``Content-Length``
and ``Inference-Header-Content-Length`` (a client whose bodies vary in size: JSON numbers written at
different lengths, request or sequence IDs).

A head that differs in those digits alone is the same head to llhttp but for the two values, so it is
taken without llhttp when its bytes are the known head's, piece for piece, with 1 to 15 ASCII digits
(nothing else) in place of each value; the new ``Content-Length`` must pass the lane's bound, as
``lane_request`` checks it. Anything else (another field, a value with spaces after it, a sign, more
digits) is read afresh by ``HeadReader``, which then refuses, hands over or takes it as it always does.
"""

from __future__ import annotations

from appliance.rest.lane_wire import LaneHead

__all__ = ["KnownHead"]

_VARYING = (b"content-length", b"inference-header-content-length")
_MAX_DIGITS = 15
"""The most digits a varying value may have here (``_header_length``'s bound; Content-Length's is 12)."""
_MAX_LENGTH_DIGITS = 12
"""The most digits of a Content-Length ``lane_request`` takes."""


def _split(raw: bytes) -> tuple[tuple[bytes, ...], tuple[tuple[bytes, str], ...]] | None:
    """``raw`` (a whole head) cut around the digits of its varying fields, and those fields (lower-case
    name, name as sent) in order; None when it has none, one twice, or one whose value is not bare digits."""
    pieces: list[bytes] = []
    fields: list[tuple[bytes, str]] = []
    start = 0
    offset = raw.find(b"\r\n") + 2  # past the request line
    while True:
        end = raw.find(b"\r\n", offset)
        if end <= offset:  # the blank line (or no line end: not a head)
            break
        name, _, value = raw[offset:end].partition(b":")
        key = name.lower()
        if key in _VARYING:
            digits = value.lstrip(b" \t")
            if any(key == seen for seen, _ in fields) or not digits.isdigit() or len(digits) > _MAX_DIGITS:
                return None
            pieces.append(raw[start:end - len(digits)])
            fields.append((key, name.decode("latin-1")))
            start = end
        offset = end + 2
    if not fields:
        return None
    pieces.append(raw[start:])
    return tuple(pieces), tuple(fields)


class KnownHead:
    """A connection's last lane head: its bytes (``raw``) and what was read from them (``head``)."""

    __slots__ = ("raw", "head", "_pieces", "_fields", "_max_body")

    def __init__(self, raw: bytes, head: LaneHead, max_body: int) -> None:
        self.raw = raw
        self.head = head
        self._max_body = max_body
        self._pieces: tuple[bytes, ...] | None = None
        """``raw`` cut around its lengths' digits (``_split``), once a head that is not ``raw`` came; () where
        it cannot be: a connection whose heads repeat, or that sends one, never cuts it."""
        self._fields: tuple[tuple[bytes, str], ...] = ()

    def next_head(self, data: bytes | bytearray) -> tuple[int, LaneHead] | None:
        """The head ``data`` starts with, where it is this one's (then the known head from now on), and its
        length in bytes; None where it must be read afresh (or is still coming)."""
        raw = self.raw
        if data.startswith(raw):
            return len(raw), self.head
        pieces = self._pieces
        if pieces is None:
            split = _split(raw)
            pieces, self._fields = split if split is not None else ((), ())
            self._pieces = pieces
        if not pieces or not data.startswith(pieces[0]):
            return None
        position = len(pieces[0])
        values: list[str] = []
        for piece in pieces[1:]:
            end = data.find(b"\r", position, position + _MAX_DIGITS + 1)
            if end <= position:
                return None
            digits = data[position:end]
            if not digits.isdigit() or not data.startswith(piece, end):
                return None
            values.append(digits.decode("ascii"))
            position = end + len(piece)
        head = self._resized(values)
        if head is None:
            return None
        self.raw, self.head = bytes(data[:position]), head
        return position, head

    def _resized(self, values: list[str]) -> LaneHead | None:
        """The known head with these values of its varying fields; None for a Content-Length the lane does
        not take (``lane_request``'s bound: the head is read afresh, and handed over)."""
        head = self.head
        length = head.length
        headers = head.headers.copy()
        for (key, name), value in zip(self._fields, values):
            if key == b"content-length":
                length = int(value)
                if len(value) > _MAX_LENGTH_DIGITS or length > self._max_body:
                    return None
            headers[name] = value
        return head.resized(headers, length)
