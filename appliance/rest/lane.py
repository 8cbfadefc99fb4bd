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

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable

from appliance.core.errors import ApplianceError
from appliance.protocol.dataplane import DataPlane
from appliance.protocol.inference import Target
from appliance.protocol.operations import Operation
from appliance.rest.browser import check_host
from appliance.rest.codec import encode_answer
from appliance.rest.http_basics import HEADER_LENGTH
from appliance.rest.infer_body import InferBody
from appliance.rest.lane_connection import LaneConnection, LaneConnections
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
from appliance.security.fleet_signature import FleetVerifier

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
        account.reserve(len(body))
        if self._signed is not None:
            FleetVerifier.check_body(self._signed, hashlib.sha256(body).hexdigest())
        return body


class InferLane(LaneConnections):
    """The lane of one HTTP port: answers lane requests through ``dataplane`` and keeps its connections
    (``protocol`` makes one per accepted socket)."""

    def __init__(self, dataplane: DataPlane, config: RestConfig, header_timeout: float) -> None:
        super().__init__(header_timeout, config.body.read_timeout, config.body.max_bytes)
        self._dataplane = dataplane
        self._config = config

    async def answer(self, head: LaneHead, body: Callable[[], Awaitable[bytes]], peer: str | None,
                     local: str | None) -> tuple[list[bytes], bool]:
        """The answer to one lane request whose head is in (``body`` waits for its body; it is admitted
        first), and whether the connection must close after it."""
        received_ns = time.monotonic_ns()  # the trace's REQUEST_START
        config = self._config
        headers = head.headers
        try:
            check_host(headers, config.hosts)
            who = http_caller(headers, peer, local, (head.method, head.target), config.trusted_proxies)
            with self._dataplane.admit(head.operation, who) as signed:
                if head.operation is not Operation.INFER:
                    return self._read(head), False
                source = InferBody(lambda: Target(head.model, head.version), headers.get(HEADER_LENGTH),
                                   _Received(body, signed).read, headers)
                async with self._dataplane.infer(who, source, received_ns=received_ns) as result:
                    payload, json_length = await encode_answer(result.response, result.request)
        except ApplianceError as exc:
            return error_answer(exc)
        except Exception as exc:
            log.exception("unhandled error serving %s %s", head.method, head.target)
            return internal_error(exc), False
        return infer_answer(payload, json_length), False

    def _read(self, head: LaneHead) -> list[bytes]:
        """The answer to a read, as aiohttp's handler for its route answers it (appliance.rest.reads)."""
        status, body, error = answer_read(self._dataplane, head.operation, head.model, head.version)
        if error is not None:
            return error_response(status, error)
        return empty_answer(status) if body is None else json_answer(body)
