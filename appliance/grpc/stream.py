"""ModelStreamInfer for models that answer each request once: every request read from the stream runs
at once (so a stream's requests batch with each other and with everyone else's), each answer is written
as it is ready, and an error ends only its own request, in the stream, as Triton does.

Requests of one sequence (the same ``sequence_id``) reach the model in the order they were sent: each
waits until the one before it on this stream is answered (a sequence runs one step at a time anyway).

When the server stops, the stream reads no further: the requests already read are answered, then the
stream ends UNAVAILABLE so the client knows that what it sent after that was not served.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from tritonclient.grpc import service_pb2 as pb

from appliance.errors import ApplianceError, Unavailable
from appliance.grpc.access import Access, Gate
from appliance.grpc.errors import abort

__all__ = ["serve_stream"]

log = logging.getLogger(__name__)

Infer = Callable[[pb.ModelInferRequest], Awaitable[pb.ModelInferResponse]]


def _error(request: pb.ModelInferRequest, message: str) -> pb.ModelStreamInferResponse:
    # The request's id and model come back with the error, so the client can tell which one failed.
    return pb.ModelStreamInferResponse(
        error_message=message,
        infer_response=pb.ModelInferResponse(model_name=request.model_name, model_version=request.model_version,
                                             id=request.id),
    )


def _sequence_key(request: pb.ModelInferRequest) -> tuple[str, str, object] | None:
    parameter = request.parameters.get("sequence_id")
    if parameter is None:
        return None
    choice = parameter.WhichOneof("parameter_choice")
    value = getattr(parameter, choice) if choice is not None else None
    return None if value in (None, 0, "") else (request.model_name, request.model_version, value)


async def _answer(request: pb.ModelInferRequest, infer: Infer, gate: Gate) -> pb.ModelStreamInferResponse:
    try:
        with gate.admit(Access.INFERENCE):
            return pb.ModelStreamInferResponse(infer_response=await infer(request))
    except ApplianceError as exc:
        return _error(request, exc.message)
    except Exception as exc:  # noqa: BLE001 - a bug: this request fails, the stream goes on
        log.error("unhandled error serving a ModelStreamInfer request", exc_info=exc)
        return _error(request, f"internal error: {type(exc).__name__}: {exc}")


async def serve_stream(requests: AsyncIterator[pb.ModelInferRequest], context: grpc.aio.ServicerContext,
                       infer: Infer, gate: Gate) -> None:
    writing = asyncio.Lock()  # one write at a time on the stream
    pending: set[asyncio.Task] = set()
    last_of_sequence: dict[object, asyncio.Task] = {}

    async def respond(request: pb.ModelInferRequest, before: asyncio.Task | None) -> None:
        if before is not None:
            await asyncio.wait((before,))
        message = await _answer(request, infer, gate)
        async with writing:
            await context.write(message)

    def forget(key: object, task: asyncio.Task) -> None:
        pending.discard(task)
        if last_of_sequence.get(key) is task:
            del last_of_sequence[key]

    stopping = asyncio.ensure_future(gate.wait_stopping())
    reader = aiter(requests)
    read: asyncio.Future | None = None
    interrupted = False
    try:
        while True:
            read = asyncio.ensure_future(anext(reader))
            await asyncio.wait((read, stopping), return_when=asyncio.FIRST_COMPLETED)
            if not read.done():
                interrupted = True
                break
            try:
                request = read.result()
            except StopAsyncIteration:
                break
            key = _sequence_key(request)
            task = asyncio.create_task(respond(request, last_of_sequence.get(key) if key is not None else None))
            pending.add(task)
            if key is not None:
                last_of_sequence[key] = task
            task.add_done_callback(functools.partial(forget, key))
        if pending:
            await asyncio.gather(*pending)
    finally:
        stopping.cancel()
        if read is not None and not read.done():
            read.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await read
        for task in pending:  # the client went away: its requests are dropped from the queues
            task.cancel()
    if interrupted:
        await abort(context, Unavailable("the server is stopping: requests sent on this stream after the "
                                         "ones answered were not served; retry them on another box", retry_after=1))
