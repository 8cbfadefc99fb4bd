"""Property-based fuzzing of the infer lane's connection (``appliance.rest.lane.LaneConnection``) in-process.

The lane runs over a real data plane (the example repository's ``simple`` model loaded in this process)
behind a fake transport that honours ``pause_reading``; a recording protocol stands in for aiohttp. Bytes
arrive split at arbitrary points over several ``data_received`` calls: arbitrary bytes, valid requests
(lane requests, and requests that hand the connection over) pipelined, and those mutated byte by byte or
with HTTP's own separators. Whatever arrives, nothing escapes but the lane's answers; every answer is a
well-formed HTTP/1.1 response, never a 500, and a 4xx with a body says ``{"error": ...}``; nothing comes
after an answer that says ``Connection: close``; the connection ends (closed or handed over) within a time
bound; the bytes it holds stay within a head and a body beyond one read; and what is handed to aiohttp is
exactly the tail of what the client sent. Each test runs a fixed, derandomized set of examples so that CI
is reproducible and bounded in time.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httptools
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.backends import RuntimeOptions
from appliance.examples import build_example_repository
from appliance.protocol.dataplane import DataPlane
from appliance.repository.registry import ModelRegistry
from appliance.rest.lane import InferLane
from appliance.rest.lane_head import LANE_HEAD_BYTES
from appliance.rest.lane_wire import LANE_BODY_BYTES
from appliance.rest.rest_config import BodyLimits, RestConfig
from tests.appliance.strategies_fuzz import mutated
from tests.waiting import await_until, next_turn

pytestmark = pytest.mark.timeout(300)  # a hang fails the test instead of stalling CI

FUZZ = settings(max_examples=300, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FEW = settings(FUZZ, max_examples=100)

BODY_TIMEOUT = 0.2  # an unfinished body is answered 408 this soon
EXAMPLE_SECONDS = 10.0  # each example ends (closed or handed over) within this
_PEER = ("127.0.0.1", 40000)
_LOCAL = ("127.0.0.1", 8000)

_JSON = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
                               {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}]}).encode()


def _post(path: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
            % (path, len(body), extra, body))


def _get(path: bytes, extra: bytes = b"") -> bytes:
    return b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n" % (path, extra)


LANE_REQUESTS = [
    _post(b"/v2/models/simple/infer", _JSON),
    _post(b"/v2/models/simple/versions/1/infer", _JSON),
    _post(b"/v2/models/simple/infer", b"{not json"),
    _post(b"/v2/models/nothere/infer", _JSON),
    _post(b"/v2/models/simple/infer", b"\0" * 64, b"Inference-Header-Content-Length: 0\r\n"),
    _get(b"/v2/health/live"),
    _get(b"/v2/health/ready"),
    _get(b"/v2/models/simple/ready"),
    _get(b"/v2/models/simple"),
    _get(b"/v2/models/simple/config"),
    _get(b"/v2/models/nothere"),
    _get(b"/v2/health/live", b"Connection: close\r\n"),
]
HANDED_REQUESTS = [  # well-formed, and aiohttp's
    _get(b"/v2/models/stats"),
    b"GET /v2/health/live HTTP/1.0\r\n\r\n",
    b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    _post(b"/v2/models/simple/infer", _JSON, b"Accept-Encoding: gzip\r\n"),
]
_SEPARATORS = (b"\r", b"\n", b"\r\n", b"\r\n\r\n", b":", b" ", b"\t", b"\0", b"\x7f", b"\xff", b",",
               b"Host: x\r\n", b"Content-Length: 5\r\n", b"Content-Length: 99999999\r\n",
               b"Transfer-Encoding: chunked\r\n", b"Connection: close\r\n", b"\r\n folded\r\n", b"X: " + b"a" * 9000)


class _Handed(asyncio.Protocol):
    """Stands in for aiohttp's protocol: records what it is handed."""

    def __init__(self) -> None:
        self.made = False
        self.data = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made = True

    def data_received(self, data: bytes) -> None:
        self.data += data

    def eof_received(self) -> bool:
        return False


class _Transport(asyncio.Transport):
    """A socket's transport as the lane sees it: writes are recorded, ``close`` ends the connection on the
    loop's next turn, and reading stops while paused."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._loop = loop
        self.protocol: asyncio.Protocol | None = None
        self.written = bytearray()
        self.closing = False
        self.lost = False
        self.paused = False
        self.eof = False

    def write(self, data: Any) -> None:
        assert not self.eof, "written after write_eof"
        if not self.closing:
            self.written += data

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self._loop.call_soon(self._lose)

    def _lose(self) -> None:
        self.lost = True
        assert self.protocol is not None
        self.protocol.connection_lost(None)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_reading(self) -> bool:
        return not self.paused

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": _PEER, "sockname": _LOCAL}.get(name, default)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """An event loop, an infer lane on it over a data plane with the example models loaded, and what
    escaped onto the loop."""
    repository = build_example_repository(tmp_path_factory.mktemp("lane-fuzz") / "repo")
    loop = asyncio.new_event_loop()
    errors: list[dict] = []  # what escapes onto the loop: a task's exception, a callback's
    loop.set_exception_handler(lambda _, context: errors.append(context))
    registry = ModelRegistry(repository, RuntimeOptions())
    loop.run_until_complete(registry.load_all(["simple"]))
    plane = DataPlane(registry)
    plane.mark_loaded()
    lane = InferLane(plane, RestConfig(BodyLimits(1 << 20, BODY_TIMEOUT)), header_timeout=30.0)
    try:
        yield loop, lane, errors
    finally:
        loop.run_until_complete(registry.close(5))
        loop.close()


class _Outcome:
    def __init__(self, written: bytes, handed: _Handed, closed: bool, peak: int) -> None:
        self.written = written
        self.handed = handed
        self.closed = closed
        self.peak = peak


async def _exchange(lane: InferLane, chunks: list[bytes], answered_first: bool = False) -> _Outcome:
    """One connection: ``chunks`` arrive one by one (each when the lane reads; ``answered_first``: each once
    the request before it is answered, as a client waiting for its answer sends), then the client's end."""
    loop = asyncio.get_running_loop()
    transport = _Transport(loop)
    handed = _Handed()
    connection = lane.protocol(lambda: handed)()
    transport.protocol = connection
    connection.connection_made(transport)
    deadline = time.monotonic() + EXAMPLE_SECONDS
    peak = 0
    for chunk in chunks:
        await await_until(lambda: not transport.paused or transport.closing, timeout=deadline - time.monotonic(),
                          what="reading to resume", interval=0.001)
        if answered_first:
            await await_until(lambda: connection.running is None or transport.closing,
                              timeout=deadline - time.monotonic(), what="the answer", interval=0.001)
        if transport.closing:
            break
        connection.data_received(chunk)
        if not handed.made:
            assert connection.buffered <= LANE_HEAD_BYTES + LANE_BODY_BYTES + len(chunk), connection.buffered
            peak = max(peak, connection.buffered)
        await next_turn()
    # The client has sent everything: the lane answers what it took, then (idle) sees the client's end.
    def ended() -> bool:
        if transport.closing or handed.made:
            return True
        if connection.running is None and not transport.paused:
            if not connection.eof_received():
                transport.close()
            return True
        return False

    await await_until(ended, timeout=deadline - time.monotonic(), what="the connection to end", interval=0.001)
    await await_until(lambda: transport.lost or not transport.closing, timeout=deadline - time.monotonic(),
                      what="the connection to close", interval=0)
    return _Outcome(bytes(transport.written), handed, transport.closing, peak)


class _Responses:
    """httptools' response parser's callbacks: each response's status, headers and body."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.answers: list[tuple[int, dict[str, str], bytes]] = []
        self.begun = 0
        self._headers: dict[str, str] = {}
        self._body = bytearray()

    def on_message_begin(self) -> None:
        self.begun += 1

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode().lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        self.answers.append((self.parser.get_status_code(), self._headers, bytes(self._body)))
        self._headers, self._body = {}, bytearray()


def _answers(written: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    responses = _Responses()
    responses.parser.feed_data(written)  # raises on anything that is not well-formed HTTP/1.1
    assert responses.begun == len(responses.answers), "a truncated answer"
    return responses.answers


def _check(outcome: _Outcome, sent: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    answers = _answers(outcome.written)
    for index, (status, headers, body) in enumerate(answers):
        assert status != 500 and 200 <= status < 600, (status, body)
        assert "server" not in headers  # the lane's, not aiohttp's
        if status >= 400 and body:
            error = json.loads(body)["error"]
            assert isinstance(error, str) and error
        if headers.get("connection") == "close":
            assert index == len(answers) - 1, "an answer after Connection: close"
            assert not outcome.handed.made
    if outcome.handed.made:
        assert sent.endswith(outcome.handed.data), "aiohttp was not handed the tail of what was sent"
        assert outcome.handed.data, "handed over without the request"
    else:
        assert outcome.closed
    return answers


def _split(draw: st.DrawFn, data: bytes) -> list[bytes]:
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=8)))
    points = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(points, points[1:], strict=False) if b > a] or [b""]


def _run(served, chunks: list[bytes], answered_first: bool = False) -> _Outcome:
    loop, lane, errors = served
    errors.clear()
    outcome = loop.run_until_complete(asyncio.wait_for(_exchange(lane, chunks, answered_first), EXAMPLE_SECONDS + 5))
    loop.run_until_complete(next_turn())  # what the connection's end left to run
    assert not errors, errors
    assert not lane.connections, "a connection outlived its end"
    return outcome


@st.composite
def _http_mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with HTTP's own separators and fields inserted or overwritten, then byte-level mutations."""
    out = bytearray(data)
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(out)))
        piece = draw(st.sampled_from(_SEPARATORS))
        if draw(st.booleans()):
            out[at:at] = piece
        else:
            out[at:at + len(piece)] = piece
    return draw(mutated(bytes(out))) if draw(st.booleans()) else bytes(out)


_PIPELINE = st.lists(st.sampled_from(LANE_REQUESTS + HANDED_REQUESTS), min_size=1, max_size=4)


@FUZZ
@given(st.data())
def test_pipelined_valid_requests_split_anywhere_are_answered_in_order(served, data):
    requests = data.draw(_PIPELINE)
    sent = b"".join(requests)
    outcome = _run(served, _split(data.draw, sent))
    answers = _check(outcome, sent)
    served_here, closed_here = 0, False
    for request in requests:
        if request in HANDED_REQUESTS:
            break
        served_here += 1
        if b"Connection: close" in request:
            closed_here = True  # what follows is never read
            break
    assert len(answers) == served_here, (len(answers), served_here)
    assert all(status < 500 for status, _, _ in answers)
    handed_next = not closed_here and served_here < len(requests) and requests[served_here] in HANDED_REQUESTS
    assert outcome.handed.made == handed_next
    if outcome.handed.made:  # aiohttp gets its request and everything after, byte for byte
        assert bytes(outcome.handed.data) == b"".join(requests[served_here:])
    whole = _run(served, [sent])  # the split changes nothing
    assert [s for s, _, _ in _answers(whole.written)] == [s for s, _, _ in answers]


@FUZZ
@given(st.data())
def test_mutated_requests_get_the_lanes_answers_and_nothing_else(served, data):
    sent = data.draw(_PIPELINE.flatmap(lambda requests: _http_mutated(b"".join(requests))))
    _check(_run(served, _split(data.draw, sent)), sent)


@FUZZ
@given(st.data())
def test_arbitrary_bytes_never_crash_or_hang_the_lane(served, data):
    sent = data.draw(st.binary(max_size=2048) | st.builds(lambda b, r: r + b, st.binary(max_size=512),
                                                          st.sampled_from(LANE_REQUESTS)))
    _check(_run(served, _split(data.draw, sent)), sent)


@FEW
@given(st.data())
def test_floods_stay_bounded(served, data):
    """Heads and bodies far past the lane's bounds, and pipelined floods: answered or handed over, with no
    more held than a head and a body beyond one read."""
    kind = data.draw(st.sampled_from(("head", "line", "fields", "pipelined", "body", "blank")))
    size = data.draw(st.integers(LANE_HEAD_BYTES // 2, 3 * (LANE_HEAD_BYTES + LANE_BODY_BYTES)))
    if kind == "head":
        sent = b"GET /v2/health/live HTTP/1.1\r\nHost: h\r\n" + b"X: y\r\n" * (size // 6)
    elif kind == "line":
        sent = b"GET /v2/health/live HTTP/1.1\r\nHost: h\r\nX: " + b"a" * size
    elif kind == "fields":
        sent = b"GET /v2/health/live HTTP/1.1\r\nHost: h\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(size // 10))
    elif kind == "pipelined":
        sent = _get(b"/v2/health/live") * 400 + b"GET /v2/health/live HTTP/1.1\r\nHost: h\r\nX: " + b"a" * size
    elif kind == "body":
        sent = _post(b"/v2/models/simple/infer", b" " * size)
    else:
        sent = b"\r\n" * (size // 2)
    outcome = _run(served, _split(data.draw, sent))
    _check(outcome, sent)
    assert outcome.peak <= LANE_HEAD_BYTES + LANE_BODY_BYTES + len(sent)
    if kind in ("head", "line", "fields"):
        assert _answers(outcome.written)[-1][0] == 431


@FEW
@given(st.data())
def test_a_head_after_one_the_connection_sent_reads_as_it_would_on_a_new_connection(served, data):
    """A connection reuses its last head's reading when the next head is that head byte for byte: whatever
    follows an answered request (the same head, a near copy of it, garbage) gets what it would get first
    on a connection of its own."""
    first = data.draw(st.sampled_from(LANE_REQUESTS[:2]))  # answered 200, and the connection stays
    then = data.draw(st.just(first) | _http_mutated(first))
    alone = _run(served, [then])
    after = _run(served, _split(data.draw, first + then))
    _check(after, first + then)
    statuses = [status for status, _, _ in _answers(after.written)]
    assert statuses == [200] + [status for status, _, _ in _answers(alone.written)]
    assert after.handed.made == alone.handed.made and bytes(after.handed.data) == bytes(alone.handed.data)
    # Sent whole in one read once the first is answered (the lane then starts it from the read itself).
    waited = _run(served, [first, then], answered_first=True)
    _check(waited, first + then)
    assert [status for status, _, _ in _answers(waited.written)] == statuses
    assert waited.handed.made == alone.handed.made and bytes(waited.handed.data) == bytes(alone.handed.data)


def test_a_body_that_starts_after_a_pipelined_answer_waits_body_timeout_not_header_timeout(served):
    """Found by the fuzzing above: the wait for a pipelined request's body ran to the end of the wait for
    its head (header_timeout, 30 s here) instead of body_timeout."""
    infer = _post(b"/v2/models/simple/infer", _JSON)
    started = time.monotonic()
    outcome = _run(served, [_get(b"/v2/models/simple") + infer[:-20]])
    answers = _check(outcome, b"")
    assert [status for status, _, _ in answers] == [200, 408]
    assert answers[-1][1]["connection"] == "close" and "body_timeout" in json.loads(answers[-1][2])["error"]
    assert time.monotonic() - started < BODY_TIMEOUT + 2
