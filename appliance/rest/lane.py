"""The infer lane: KServe v2 inference and its reads served straight from a connection's bytes.

aiohttp costs about as much per request as the daemon's own request path outside the model (a task, a
request object, a router lookup, middleware frames and a response object per request): more than the
whole of what Triton spends on a small request (docs/performance.md). The lane serves the request that
is sent thousands of times a second — infer — and the reads a client makes between inferences (server
liveness and readiness, a model's readiness, metadata and config) with an answer writer of its own over
heads that llhttp reads (``httptools``: ``appliance.rest.lane_head``), through the same data plane,
admission, Host and browser rules, limits and error answers as aiohttp's routes. Every connection starts
on the lane; the first request that is not a lane request hands the connection, with every byte it has
sent for that request and after, to aiohttp for good, so every other route and every unusual request
(chunked or compressed bodies, HTTP/1.0, a percent-encoded path, a large body, Expect, Upgrade, a
compressed answer asked for) is served by aiohttp exactly as without the lane.

Every head the lane reads (lane requests, and the one that hands the connection over) is bounded and
checked first: a line over 8 KiB or more than 100 fields get 431 (a request target over 8 KiB, 414), a
head over 32 KiB 431, a malformed head (bare LF line endings, folded or malformed fields, control bytes,
two ``Content-Length``, ``Content-Length`` beside ``Transfer-Encoding``) and an HTTP/1.1 request
without exactly one ``Host`` 400, each at once with ``{"error": ...}`` and ``Connection: close``; the
connection then takes no more requests (it reads and drops what the client still sends for a moment,
so that the answer is not lost to a reset) and closes.

A lane request is ``POST /v2/models/<name>[/versions/<n>]/infer HTTP/1.1`` (a name of letters, digits,
``_``, ``-`` and ``.``, not starting with a dot; no query) with a ``Content-Length`` of at most 64 KiB
and ``max_request_bytes``, or a ``GET`` of ``/v2/health/live``, ``/v2/health/ready`` or
``/v2/models/<name>[/versions/<n>][/ready|/config]`` without a body; with no ``Transfer-Encoding``,
``Expect`` or ``Upgrade``, no ``Content-Encoding`` but identity and no ``Accept-Encoding`` that asks for
gzip or deflate.

A lane request is admitted (Host, token, the bound on requests in flight) as soon as its head is in, as
aiohttp's route is: its body is collected while it waits, and handed to it whole. Requests on a
connection are served one at a time, in order (pipelined ones wait; reading pauses while more than a
head and a body wait). The timeouts are aiohttp's: a request head must be complete within
``header_timeout`` of the connection opening or of the last answer (then the connection closes: idle
keep-alive connections too), and each next piece of a body must arrive within ``body_timeout`` (then
408, and the connection closes). Every answer after which the lane closes the connection (the client
asked, a 408, the server stopping) says ``Connection: close``. A request answered before its body is in
(refused, an unknown model) has the rest of its body dropped as it comes. A client that goes away
cancels its request, which leaves its model's queue. ``InferLane.stop`` keeps to the daemon's stop
deadline as aiohttp's connections do.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable

from appliance.core.errors import ApplianceError, InferenceFailed
from appliance.protocol.admission import Admitted, Caller
from appliance.protocol.dataplane import DataPlane
from appliance.protocol.inference import DECODE_OFF_LOOP_BYTES, Flight, Target
from appliance.protocol.operations import Operation
from appliance.protocol.results import InferResult
from appliance.rest.browser import check_host
from appliance.rest.codec import binary_answer, encode_answer, encode_in_pieces, encoding_work, plain_answer
from appliance.rest.http_basics import HEADER_LENGTH
from appliance.rest.infer_body import InferBody, count_body
from appliance.rest.lane_connection import LaneConnection, LaneConnections, Running
from appliance.rest.lane_wire import (
    LaneHead,
    empty_answer,
    error_answer,
    error_response,
    infer_answer,
    internal_error,
    json_answer,
)
from appliance.rest.reads import answer_read
from appliance.rest.rest_config import RestConfig
from appliance.rest.security import http_caller
from appliance.security.budget import Account

__all__ = ["InferLane", "LaneConnection"]

log = logging.getLogger(__name__)


class _Received:
    """A lane request's body as its connection collects it: reading it waits for all of it, counts it on
    the request's account and checks a signed request's digest, as ``appliance.rest.body.read_body``
    does for aiohttp's route."""

    __slots__ = ("_collect", "_signed")

    def __init__(self, collect: Callable[[], Awaitable[bytes]], signed: str | None) -> None:
        self._collect = collect
        self._signed = signed

    async def read(self, account: Account) -> bytes:
        body = await self._collect()
        count_body(body, account, self._signed)
        return body


async def _encoded(result: InferResult) -> tuple[list[bytes], bool]:
    """The answer to an infer request, encoded (on a worker thread when large)."""
    payload, json_length = await encode_answer(result.response, result.request)
    return infer_answer(payload, json_length), False


Answered = Callable[[list[bytes], bool], None]
"""Given a lane request's answer, and whether the connection must close after it."""


class InferLane(LaneConnections):
    """The lane of one HTTP port: answers lane requests through ``dataplane`` and keeps its connections
    (``protocol`` makes one per accepted socket). A request whose body came with its head is served on
    the data plane's straight line (``serve``: no task, its answer written by the step that has its
    result); one whose body is still coming, by a task (``answer``)."""

    def __init__(self, dataplane: DataPlane, config: RestConfig, header_timeout: float) -> None:
        super().__init__(header_timeout, config.body.read_timeout, config.body.max_bytes)
        self._dataplane = dataplane
        self._config = config

    def _admit(self, head: LaneHead, peer: str | None, local: str | None) -> tuple[Caller, Admitted, str | None]:
        """The Host and browser rules, the caller, and its admission (entered: the caller exits it). The
        first two depend on the head and the connection alone: a head the connection sends again keeps
        them (``LaneHead.caller``), and the access check it passed (``LaneHead.proof``); the bound on
        requests at once is asked every time."""
        who = head.caller
        if who is None:
            headers = head.headers
            check_host(headers, self._config.hosts)
            who = head.caller = http_caller(headers, peer, local, (head.method, head.target),
                                            self._config.trusted_proxies)
        admitted = self._dataplane.admit(head.operation, who, head.proof)
        signed = admitted.__enter__()
        head.proof = admitted.proof
        return who, admitted, signed

    async def answer(self, head: LaneHead, body: Callable[[], Awaitable[bytes]], peer: str | None,
                     local: str | None) -> tuple[list[bytes], bool]:
        """The answer to one lane request whose head is in (``body`` waits for its body; it is admitted
        first), and whether the connection must close after it."""
        received_ns = time.monotonic_ns()  # the trace's REQUEST_START
        try:
            who, admitted, signed = self._admit(head, peer, local)
        except Exception as exc:
            return self._refusal(head, exc)
        try:
            if head.operation is not Operation.INFER:
                return self._read(head), False
            target = self._target(head)
            if not self._dataplane.takes(target):  # read once its model is found (or refused unread)
                source = InferBody(lambda: target, head.headers.get(HEADER_LENGTH), _Received(body, signed).read,
                                   head.headers)
                return await self._infer(head, who, source, received_ns)
            source = InferBody.ready(target, head.headers.get(HEADER_LENGTH), await body(), signed, head.headers)
            answer = await self._dataplane.straight(who, source, received_ns, _encoded)
            return answer if answer is not None else await self._infer(head, who, source, received_ns)
        except Exception as exc:
            return self._refusal(head, exc)
        finally:
            admitted.__exit__(None, None, None)

    def serve(self, head: LaneHead, body: bytes, peer: str | None, local: str | None, running: Running,
              answered: Answered) -> None:
        """Answer one lane request whose body is in hand: ``answered`` gets the answer, in this step where
        it is at hand (refusals, reads), else in the step that has the model's result; ``running`` is the
        request in progress (cancelling it takes the request back; ``answered`` is not called then)."""
        received_ns = time.monotonic_ns()
        try:
            who, admitted, signed = self._admit(head, peer, local)
        except Exception as exc:
            answered(*self._refusal(head, exc))
            return
        try:
            if head.operation is not Operation.INFER:
                reply = self._read(head)
            else:
                header_length = head.headers.get(HEADER_LENGTH)
                source = InferBody.ready(self._target(head), header_length, body, signed, head.headers,
                                         None if header_length is None else head.known_header())
                straight = _Straight(self, head, admitted, answered)
                flight = self._dataplane.begin(who, source, received_ns, straight.landed)
                if flight is None:  # not the straight line's: served as a request whose body is still coming is
                    task = asyncio.get_running_loop().create_task(self._infer(head, who, source, received_ns))
                    task.add_done_callback(straight.awaited)
                    running.withdraw = task.cancel
                else:
                    running.withdraw = flight.cancel
                return
        except Exception as exc:
            reply, close = self._refusal(head, exc)
        else:
            close = False
        admitted.__exit__(None, None, None)
        answered(reply, close)

    @staticmethod
    def _target(head: LaneHead) -> Target:
        named = head.named
        if named is None:  # (a head the connection sends again keeps it)
            named = head.named = Target(head.model, head.version)
        return named

    async def _infer(self, head: LaneHead, who: Caller, source: InferBody,
                     received_ns: int) -> tuple[list[bytes], bool]:
        """The answer to an admitted infer request, on the awaited path."""
        try:
            async with self._dataplane.infer(who, source, received_ns=received_ns) as result:
                return await _encoded(result)
        except Exception as exc:
            return self._refusal(head, exc)

    def _refusal(self, head: LaneHead, exc: Exception) -> tuple[list[bytes], bool]:
        """The answer to a request that raised ``exc``: the appliance's errors as they say, anything else a
        500 (logged)."""
        if isinstance(exc, ApplianceError):
            return error_answer(exc)
        log.error("unhandled error serving %s %s", head.method, head.target, exc_info=exc)
        return internal_error(exc), False

    def _read(self, head: LaneHead) -> list[bytes]:
        """The answer to a read, as aiohttp's handler for its route answers it (appliance.rest.reads)."""
        status, body, error = answer_read(self._dataplane, head.operation, head.model, head.version)
        if error is not None:
            return error_response(status, error)
        return empty_answer(status) if body is None else json_answer(body)


class _Straight:
    """One infer request on the straight line, from its model's result to its answer: encoded in the step
    that has the result (on a worker thread when it is large), what it held let go, ``answered`` told."""

    __slots__ = ("_lane", "_head", "_admitted", "_answered")

    def __init__(self, lane: InferLane, head: LaneHead, admitted: Admitted, answered: Answered) -> None:
        self._lane = lane
        self._head = head
        self._admitted = admitted
        self._answered = answered

    def landed(self, flight: Flight, result: InferResult | None, error: BaseException | None) -> None:
        """``Inference.begin``'s ``then``."""
        if error is None:
            assert result is not None
            try:
                plain = plain_answer(result.response, result.request)  # the common answer, small by its bound
                binary = None if plain is not None else binary_answer(result.response, result.request)
                if plain is not None:
                    answer = infer_answer(plain, None), False
                elif binary is not None:  # a binary client's, as small
                    answer = infer_answer(*binary), False
                elif encoding_work(result.response, result.request) > DECODE_OFF_LOOP_BYTES:
                    encoding = asyncio.get_running_loop().create_task(encode_answer(result.response, result.request))
                    encoding.add_done_callback(functools.partial(self._encoded, flight))
                    flight.withdraw = encoding.cancel
                    return
                else:  # (plain_answer declined it: the general encoder, not the first try again)
                    answer = infer_answer(*encode_in_pieces(result.response, result.request)), False
            except Exception as exc:
                answer = self._lane._refusal(self._head, exc)
            self._finish(flight, answer, flight.sent(InferBody.frontend))
            return
        self._finish(flight, None if isinstance(error, asyncio.CancelledError) else self._lane._refusal(
            self._head, error if isinstance(error, Exception) else InferenceFailed(repr(error))), None)

    def _encoded(self, flight: Flight, encoding: asyncio.Task) -> None:
        if encoding.cancelled():
            self._finish(flight, None, None)
            return
        error = encoding.exception()
        answer = (self._lane._refusal(self._head, error) if isinstance(error, Exception)
                  else (infer_answer(*encoding.result()), False))
        self._finish(flight, answer, flight.sent(InferBody.frontend))

    def awaited(self, task: asyncio.Task) -> None:
        """The answer of a request ``begin`` did not take, served by a task."""
        self._admitted.__exit__(None, None, None)
        if not task.cancelled():
            self._answered(*task.result())

    def _finish(self, flight: Flight, answer: tuple[list[bytes], bool] | None,
                sent: tuple[str, int, int] | None) -> None:
        """Let go of what the request held; then the answer, unless it was withdrawn (the client gets its
        answer even where letting go failed: that is logged)."""
        try:
            flight.end(sent)
        except Exception:
            log.exception("letting go of what %s %s held failed", self._head.method, self._head.target)
        finally:
            self._admitted.__exit__(None, None, None)
        if answer is not None:
            self._answered(*answer)
