"""Triton's generate extension: ``POST .../generate`` (exactly one response, as JSON) and
``POST .../generate_stream`` (every response as a server-sent event), for any model; a decoupled
model's responses are written as it sends them.

Errors before the model runs are JSON errors with their status, as on every route. A failure of the
model itself is 400 on both routes, as Triton answers it; on generate_stream it is an event
``data: {"error": "..."}`` (the stream goes on), the stream's status that of its first event. A client that
disconnects cancels its request: the handler is cancelled, the stream closed, the model sees
``request.is_cancelled()``. A large answer is encoded on a worker thread (``encode_generate_answer``);
the events of a stream are written one after the other, in the order the model sent them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import orjson
from aiohttp import web

from appliance.core.errors import ApplianceError, InferenceFailed, InvalidInput
from appliance.engine.model import ModelVersion
from appliance.engine.streaming import Responses, StreamItem
from appliance.engine.tensor_checks import DecodeLimits
from appliance.engine.types import InferRequest
from appliance.protocol.inference import Target
from appliance.rest.body import read_body
from appliance.rest.generate_codec import decode_generate_request, encode_generate_answer, sse_event
from appliance.rest.keys import CONFIG, DATAPLANE
from appliance.rest.security import caller
from appliance.security.budget import Account

__all__ = ["generate", "generate_stream"]

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_ONE_RESPONSE = ("generate expects model to produce exactly 1 response, use generate stream for model that "
                 "generates various number of responses")


class _GenerateBody:
    """A generate request: a flat JSON object of the model's inputs and parameters."""

    endpoint = "generate end point"
    frontend = "HTTP"
    streaming_alternative = "POST .../generate_stream"

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self._body = b""

    async def target(self, account: Account) -> Target:
        return Target(self._request.match_info["model"], self._request.match_info.get("version"))

    def traceparent(self) -> str | None:
        return self._request.headers.get("traceparent")

    async def receive(self, account: Account) -> int:
        self._body = await read_body(self._request, account, self._request.app[CONFIG].body)
        return len(self._body)

    def decode(self, model: ModelVersion, limits: DecodeLimits, reserve: Callable[[int], None]) -> InferRequest:
        return decode_generate_request(self._body, model.signature, limits, reserve)


def _responses(request: web.Request):
    plane = request.app[DATAPLANE]
    return plane.infer_stream(caller(request), _GenerateBody(request), received_ns=time.monotonic_ns())


def _as_generate_error(error: ApplianceError) -> ApplianceError:
    """Triton's generate endpoints answer a failure of the model with 400, whatever it was."""
    return InvalidInput(error.message) if error.from_model else error


async def generate(request: web.Request) -> web.Response:
    try:
        return await _generate(request)
    except ApplianceError as error:
        raise _as_generate_error(error) from None


async def _generate(request: web.Request) -> web.Response:
    async with _responses(request) as responses:
        answer: bytes | None = None
        async for item in responses:
            if item.error is not None:
                raise item.error
            if item.response is None:
                continue  # the final flag alone
            if answer is not None:
                raise InferenceFailed(_ONE_RESPONSE)  # leaving the stream cancels the rest
            answer = await encode_generate_answer(item.response)  # off the loop when large
        if answer is None:
            raise InferenceFailed(_ONE_RESPONSE)
    return web.Response(body=answer, content_type="application/json")


async def _event(item: StreamItem) -> bytes | None:
    if item.error is not None:
        return sse_event(orjson.dumps({"error": item.error.message}))
    if item.response is None:
        return None
    try:
        return await encode_generate_answer(item.response, event=True)  # off the loop when large
    except ApplianceError as exc:
        return sse_event(orjson.dumps({"error": exc.message}))


async def generate_stream(request: web.Request) -> web.StreamResponse:
    async with contextlib.AsyncExitStack() as stack:
        try:
            responses = await stack.enter_async_context(_responses(request))
        except ApplianceError as error:
            if not error.from_model:
                raise  # refused before the model ran: a JSON error with its status
            # The model failed (one that answers once fails before its one response): as Triton, an
            # event stream whose one event is the error, under 400.
            stream = web.StreamResponse(status=400, headers=_SSE_HEADERS)
            await stream.prepare(request)
            await stream.write(sse_event(orjson.dumps({"error": error.message})))
            await stream.write_eof()
            return stream
        return await _write_events(request, responses)


async def _write_events(request: web.Request, responses: Responses) -> web.StreamResponse:
    stream: web.StreamResponse | None = None
    async for item in responses:
        if item.final:
            responses.close()  # counted in the statistics before the client sees the end
        event = await _event(item)  # in order: the next response waits until this one is written
        if event is None:
            continue
        if stream is None:
            status = _as_generate_error(item.error).status if item.error is not None else 200
            stream = web.StreamResponse(status=status, headers=_SSE_HEADERS)
            await stream.prepare(request)
        try:
            await stream.write(event)  # waits while the client is slow: the model is held back
        except ConnectionError:
            return stream  # the client went away: leaving the responses cancels the request
    if stream is None:  # the model sent no response at all: an empty event stream
        stream = web.StreamResponse(headers=_SSE_HEADERS)
        await stream.prepare(request)
    await stream.write_eof()
    return stream
