"""Triton's generate extension: ``POST .../generate`` (exactly one response, as JSON) and
``POST .../generate_stream`` (every response as a server-sent event), for any model; a decoupled
model's responses are written as it sends them.

Errors before the model runs are JSON errors with their status, as on every route. Once a stream has
started, an error is an event ``data: {"error": "..."}``; the status is that of the first event (so a
stream whose first event is an error carries that error's status, as Triton does). A client that
disconnects cancels its request: the handler is cancelled, the stream closed, the model sees
``request.is_cancelled()``.
"""

from __future__ import annotations

import time

import orjson
from aiohttp import web

from appliance.budget import Account
from appliance.engine.model import ModelVersion
from appliance.engine.streaming import Responses, StreamItem
from appliance.errors import ApplianceError, InferenceFailed
from appliance.rest.body import read_body
from appliance.rest.generate_codec import decode_generate_request, encode_generate_response, sse_event
from appliance.rest.keys import BODY_LIMITS, BUDGET, DATAPLANE, LIMITS

__all__ = ["generate", "generate_stream"]

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_ONE_RESPONSE = ("generate expects model to produce exactly 1 response, use generate stream for model that "
                 "generates various number of responses")


async def _responses(request: web.Request, model: ModelVersion, account: Account, received_ns: int) -> Responses:
    body = await read_body(request, account, request.app[BODY_LIMITS])
    decoded = decode_generate_request(body, model.signature, request.app[LIMITS], account.reserve)
    return await request.app[DATAPLANE].infer_stream(model, decoded, local=False, reserve=account.reserve,
                                                     release=account.release, received_ns=received_ns)


def _model(request: web.Request) -> ModelVersion:
    return request.app[DATAPLANE].model(request.match_info["model"], request.match_info.get("version"))


async def generate(request: web.Request) -> web.Response:
    received_ns = time.monotonic_ns()
    with _model(request).in_use() as model, request.app[BUDGET].account() as account:
        responses = await _responses(request, model, account, received_ns)
        try:
            answer: bytes | None = None
            async for item in responses:
                if item.error is not None:
                    raise item.error
                if item.response is None:
                    continue  # the final flag alone
                if answer is not None:
                    raise InferenceFailed(_ONE_RESPONSE)  # closing the stream cancels the rest
                answer = encode_generate_response(item.response)
            if answer is None:
                raise InferenceFailed(_ONE_RESPONSE)
        finally:
            responses.close()
    return web.Response(body=answer, content_type="application/json")


def _event(item: StreamItem) -> bytes | None:
    if item.error is not None:
        return sse_event(orjson.dumps({"error": item.error.message}))
    if item.response is None:
        return None
    try:
        return sse_event(encode_generate_response(item.response))
    except ApplianceError as exc:
        return sse_event(orjson.dumps({"error": exc.message}))


async def generate_stream(request: web.Request) -> web.StreamResponse:
    received_ns = time.monotonic_ns()
    with _model(request).in_use() as model, request.app[BUDGET].account() as account:
        responses = await _responses(request, model, account, received_ns)
        try:
            stream: web.StreamResponse | None = None
            async for item in responses:
                if item.final:
                    responses.close()  # counted in the statistics before the client sees the end
                event = _event(item)
                if event is None:
                    continue
                if stream is None:
                    status = item.error.status if item.error is not None else 200
                    stream = web.StreamResponse(status=status, headers=_SSE_HEADERS)
                    await stream.prepare(request)
                try:
                    await stream.write(event)  # waits while the client is slow: the model is held back
                except ConnectionError:
                    return stream  # the client went away: closing the responses cancels the request
            if stream is None:  # the model sent no response at all: an empty event stream
                stream = web.StreamResponse(headers=_SSE_HEADERS)
                await stream.prepare(request)
            await stream.write_eof()
        finally:
            responses.close()
    return stream
