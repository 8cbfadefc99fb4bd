"""ModelStreamInfer: every request read from the stream runs at once (so a stream's requests batch with
each other and with everyone else's), each response is written as it is ready, and an error ends only
its own request, in the stream, as Triton does.

A model that is not decoupled answers each request once; a decoupled one sends zero, one or many
responses. Every response carries Triton's ``triton_final_response`` parameter (true on the last one of
its request); when a decoupled model ends a request with the final flag alone, an empty final response
is written only if the request set ``triton_enable_empty_final_response``. A client that cancels the
stream (or goes away) cancels its requests in flight: their models see ``request.is_cancelled()``.

Requests of one sequence (the same ``sequence_id``) reach the model in the order they were sent: each
waits until the one before it on this stream is answered (a sequence runs one step at a time anyway).

Bounds: a request's bytes count on the memory budget from the moment it is read (before it waits for the
one before it), and a compressed one is inflated on them (``appliance.protocol.inflate``); at most
``max_pending`` requests of one stream are read and not yet answered, and the stream reads no further
until one is, so HTTP/2 flow control holds the client back; a stream with nothing in flight that sends
nothing for ``idle_timeout`` is ended (UNAVAILABLE: open a new one).

When the server stops, the stream reads no further: the requests already read are answered, then the
stream ends UNAVAILABLE so the client knows that what it sent after that was not served.

A response is serialised as it is written, by the rule ModelInfer's answer follows: a large one (above
``DECODE_OFF_LOOP_BYTES`` of tensors) on a worker thread, with no message holding its tensors
(``serialize_stream_response``), a small one inline. Responses are written one at a time, in the order
they are ready: one whose serialising runs on a thread keeps its place, none overtakes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TypeAlias

import grpc
from tritonclient.grpc import service_pb2 as pb

from appliance.core.errors import ApplianceError, Unavailable
from appliance.engine.streaming import StreamItem
from appliance.engine.types import InferResponse
from appliance.grpc.access import Gate, caller_of
from appliance.grpc.admission import inflated, parse_counted
from appliance.grpc.codec import FINAL_RESPONSE, encoding_work, serialize_stream_response
from appliance.grpc.grpc_config import StreamRules
from appliance.grpc.status import abort, unexpected
from appliance.protocol.dataplane import DataPlane
from appliance.protocol.inference import decode_off_loop
from appliance.protocol.inflate import InflateLimits
from appliance.protocol.operations import Operation
from appliance.security.budget import Account

__all__ = ["GRPC_ERROR", "Reply", "StreamAnswer", "StreamFailed", "serve_stream", "stream_message",
           "wants_grpc_errors"]


@dataclasses.dataclass(frozen=True, slots=True)
class StreamAnswer:
    """A response with its tensors, to be serialised when it is written (``_serialized``)."""

    response: InferResponse
    final: bool


Reply: TypeAlias = StreamAnswer | pb.ModelStreamInferResponse
"""What a stream writes: a response with tensors, or a message without any (an error, an empty final)."""

Respond = Callable[[pb.ModelInferRequest, Account], AsyncGenerator[Reply, None]]

GRPC_ERROR = "triton_grpc_error"
"""Triton's stream header: "true" ends the stream with a response's error as its status."""


class StreamFailed(Exception):
    """A response of a stream that asked for ``triton_grpc_error`` failed: the stream ends with its status."""

    def __init__(self, error: ApplianceError) -> None:
        super().__init__(error.message)
        self.error = error


def wants_grpc_errors(context: grpc.aio.ServicerContext) -> bool:
    return any(key == GRPC_ERROR and str(value).lower() == "true" for key, value in context.invocation_metadata() or ())


def _refused(request: pb.ModelInferRequest, message: str) -> pb.ModelStreamInferResponse:
    # A request refused before it ran: the error and the request's id, as Triton answers it.
    return pb.ModelStreamInferResponse(error_message=message, infer_response=pb.ModelInferResponse(id=request.id))


def _error(request: pb.ModelInferRequest, message: str) -> pb.ModelStreamInferResponse:
    # A response that failed: the request's id and model come back with the error, and the final flag.
    answer = pb.ModelStreamInferResponse(
        error_message=message,
        infer_response=pb.ModelInferResponse(model_name=request.model_name, model_version=request.model_version,
                                             id=request.id),
    )
    answer.infer_response.parameters[FINAL_RESPONSE].bool_param = True
    return answer


def stream_message(item: StreamItem, request: pb.ModelInferRequest, empty_final: bool) -> Reply | None:
    """The reply for one response of ``request``; None for a final flag the client did not ask to see."""
    if item.error is not None:
        message = _error(request, item.error.message)
    elif item.response is not None:
        return StreamAnswer(item.response, item.final)
    elif empty_final:
        message = pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(
            model_name=request.model_name, model_version=request.model_version, id=request.id))
    else:
        return None
    message.infer_response.parameters[FINAL_RESPONSE].bool_param = item.final
    return message


async def _serialized(reply: Reply) -> bytes:
    """The bytes of ``reply``'s ModelStreamInferResponse: a large response's serialised on a worker thread
    (``decode_off_loop``, by ``encoding_work``), anything else inline."""
    if isinstance(reply, StreamAnswer):
        response = reply.response
        return await decode_off_loop(encoding_work(response), serialize_stream_response, response, reply.final)
    return reply.SerializeToString()


def _sequence_key(request: pb.ModelInferRequest) -> tuple[str, str, object] | None:
    parameter = request.parameters.get("sequence_id")
    if parameter is None:
        return None
    choice = parameter.WhichOneof("parameter_choice")
    value = getattr(parameter, choice) if choice is not None else None
    return None if value in (None, 0, "") else (request.model_name, request.model_version, value)


async def _read(raw: bytes, account: Account, inflation: InflateLimits) -> pb.ModelInferRequest:
    """One request as read from the stream: its bytes counted on ``account`` (inflated there when
    compressed) before it is parsed."""
    account.reserve(len(raw))
    raw = await inflated(raw, account, inflation)
    return await parse_counted(raw, "ModelStreamInfer", pb.ModelInferRequest.FromString, account)


async def serve_stream(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext, respond: Respond,
                       gate: Gate, dataplane: DataPlane, rules: StreamRules, inflation: InflateLimits) -> None:
    caller = caller_of(context)
    grpc_errors = wants_grpc_errors(context)
    loop = asyncio.get_running_loop()
    writing = asyncio.Lock()  # one write at a time on the stream
    pending: set[asyncio.Task] = set()
    last_of_sequence: dict[object, asyncio.Task] = {}
    quiet_since = loop.time()
    this = asyncio.current_task()
    assert this is not None, "serve_stream runs in its call's task"
    fatal: ApplianceError | None = None
    """The failed response that ends the stream at once (``triton_grpc_error``)."""
    ended: ApplianceError | None = None
    """Why the stream ends, once it reads no further."""
    parked = interrupted = False
    """This task waits for the next request or for room (``end`` may cancel it there); ``end`` cancelled it."""
    room: asyncio.Future | None = None
    """Set once fewer than ``max_pending`` requests of the stream are unanswered."""
    idle: asyncio.TimerHandle | None = None

    async def write(reply: Reply) -> None:
        # Serialised under the lock: replies are written in the order they came here, a large one's bytes
        # made on a thread meanwhile (the lock hands over first come, first served).
        async with writing:
            await context.write(await _serialized(reply))  # waits while the client is slow: the model is held back

    async def answer(message: pb.ModelInferRequest, account: Account, before: asyncio.Task | None) -> None:
        with account:  # counted from the read until answered, whichever way this ends
            if before is not None:
                await asyncio.wait((before,))
            try:
                with gate.admit(Operation.INFER, caller):
                    async with contextlib.aclosing(respond(message, account)) as messages:
                        async for reply in messages:
                            await write(reply)
            except StreamFailed as failed:  # triton_grpc_error: the stream ends with this status
                fail(failed.error)
            except ApplianceError as exc:
                if not exc.from_model:  # refused before it ran: the stream goes on
                    await write(_refused(message, exc.message))
                elif grpc_errors:
                    fail(exc)
                else:
                    await write(_error(message, exc.message))
            except Exception as exc:  # noqa: BLE001 - a bug: this request fails, the stream goes on
                await write(_refused(message, unexpected("ModelStreamInfer", exc).message))

    def forget(key: object, task: asyncio.Task) -> None:
        nonlocal quiet_since, room
        pending.discard(task)
        if last_of_sequence.get(key) is task:
            del last_of_sequence[key]
        if not pending:
            quiet_since = loop.time()
        if room is not None and len(pending) < rules.max_pending:
            if not room.done():
                room.set_result(None)
            room = None

    def end(why: ApplianceError) -> None:
        """Read no further: the stream ends with ``why`` (the first reason wins). A read or a wait for
        room is cancelled; anything else this task does ends first and the loop looks at ``ended``."""
        nonlocal ended, interrupted
        if ended is not None:
            return
        ended = why
        if parked and not interrupted:
            interrupted = True
            this.cancel()

    def fail(error: ApplianceError) -> None:
        """A response failed and the client asked for ``triton_grpc_error``: the stream ends with it at once."""
        nonlocal fatal
        if fatal is None:
            fatal = error
            end(error)

    def on_stopping(done: asyncio.Future) -> None:
        if not done.cancelled():
            end(Unavailable("the server is stopping: requests sent on this stream after the ones answered were "
                            "not served; retry them on another box", retry_after=1))

    def on_idle() -> None:
        # One timer for the stream, not one a request: it looks again when the stream may be idle next.
        nonlocal idle
        now = loop.time()
        due = (now if pending else quiet_since) + rules.idle_timeout
        if pending or now < due:
            idle = loop.call_at(due, on_idle)
            return
        idle = None
        end(Unavailable(f"the stream sent nothing for {rules.idle_timeout:g} s with no request in flight (the "
                        "grpc stream_idle_timeout setting); open a new stream"))

    stopping = asyncio.ensure_future(gate.wait_stopping())
    stopping.add_done_callback(on_stopping)
    idle = loop.call_at(quiet_since + rules.idle_timeout, on_idle)
    reader = aiter(requests)
    try:
        while ended is None:
            parked = True
            try:
                if len(pending) >= rules.max_pending:
                    room = loop.create_future()
                    await room
                    continue
                raw = await anext(reader)
            except StopAsyncIteration:
                break
            except asyncio.CancelledError:
                if not interrupted or this.uncancel() > 0:  # cancelled from outside too: the client went away
                    raise
                break
            finally:
                parked = False
            account = dataplane.account()
            try:
                message = await _read(raw, account, inflation)
            except ApplianceError as exc:  # this request is refused; the stream goes on
                account.close()
                await write(_refused(pb.ModelInferRequest(), exc.message))
                continue
            finally:
                del raw
            key = _sequence_key(message)
            before = last_of_sequence.get(key) if key is not None else None
            task = asyncio.create_task(answer(message, account, before))
            pending.add(task)
            if key is not None:
                last_of_sequence[key] = task
            task.add_done_callback(functools.partial(forget, key))
        if pending and fatal is None:  # answer what was read (a failed response ends it at once)
            await asyncio.gather(*pending)
        if fatal is not None and ended is None:  # a response failed (triton_grpc_error), maybe the last one
            ended = fatal
    finally:
        stopping.cancel()
        if idle is not None:
            idle.cancel()
        for task in pending:  # the client went away: its requests are dropped from the queues or cancelled
            task.cancel()
    if ended is not None:
        await abort(context, ended)
