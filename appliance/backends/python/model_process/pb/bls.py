"""Business Logic Scripting: a model calling other models through the server, from the model process.

A call's input tensors go into a shared-memory block of this process and only their descriptors to the
daemon, which runs the request through its own schedulers (so it batches with the other traffic and is
counted in the statistics) and writes the outputs into a block of its own. The thread that reads the
channel turns the answers into InferenceResponses; the calling thread waits (``exec``: on the stub's
main thread, running execute(), it reads the channel itself meanwhile) or awaits (``async_exec``).
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from appliance.backends.python.model_process.pb import runtime
from appliance.backends.python.model_process.pb.errors import TritonError, TritonModelException
from appliance.backends.python.model_process.pb.response import InferenceResponse
from appliance.backends.python.model_process.pb.tensor import Tensor
from appliance.backends.python.model_process.pb.transfer import read_tensors, tensors_of, write_tensors
from appliance.backends.python.wire.messages import Answer, Cancel, Gone, Infer, Result

if TYPE_CHECKING:
    import asyncio

__all__ = ["ResponseIterator", "execute", "execute_async", "is_model_ready", "load_model", "unload_model"]


class InferenceRequest(Protocol):
    """What a call takes of pb_utils.InferenceRequest (appliance.backends.python.model_process.pb.messages,
    which calls here)."""

    model_name: str
    model_version: int

    def inputs(self) -> list[Tensor]: ...

    def requested_output_names(self) -> list[str]: ...

    def request_id(self) -> str: ...

    def correlation_id(self) -> int | str: ...

    def flags(self) -> int: ...

    def timeout(self) -> int: ...

    def parameters(self) -> str: ...


def _response(message: Answer | Result | Gone, rt: runtime.Runtime) -> InferenceResponse:
    match message:
        case Result(_, _, _, (text, code)):
            return InferenceResponse(error=TritonError(text, code))
        case Result(_, ref, descriptors, None, parameters):
            return InferenceResponse(read_tensors(ref, descriptors, rt), parameters=parameters or None)
        case Gone(_, reason):
            return InferenceResponse(error=TritonError(reason, TritonError.UNAVAILABLE))
    return InferenceResponse(error=TritonError(f"the server answered a call with {type(message).__name__}"))


def _final(message: Answer | Result | Gone) -> bool:
    return not isinstance(message, Result) or message.final


def _start(request: InferenceRequest, decoupled: bool, deliver: Callable[[InferenceResponse, bool], None],
           inline: bool = False) -> int:
    """Send the request; ``deliver(response, final)`` runs on the thread that reads for every answer
    (``inline``: the caller waits in ``Runtime.wait_inline``)."""
    if not request.model_name:
        raise TritonModelException("InferenceRequest(model_name=...) is needed to execute a request")
    rt = runtime.current()
    ref, descriptors = write_tensors(tensors_of(request.inputs(), "input"))
    freed = False

    def answered(message: Answer | Result | Gone) -> bool:
        nonlocal freed
        if not freed and ref is not None:  # the daemon has read the inputs by its first answer
            freed = True
            rt.blocks.free(ref[0])
        final = _final(message)
        deliver(_response(message, rt), final)
        return final

    call = rt.start_call(answered, inline)
    meta = {
        "model_name": request.model_name, "model_version": request.model_version,
        "outputs": request.requested_output_names(), "id": request.request_id(),
        "correlation_id": _plain(request.correlation_id()), "flags": request.flags(), "timeout": request.timeout(),
        "parameters": request.parameters(), "decoupled": decoupled, "released": rt.take_released(),
    }
    rt.send(Infer(call, ref, descriptors, meta))
    return call


def _plain(correlation_id: Any) -> int | str:
    """A correlation id as the channel carries it (plain data only: a numpy integer becomes an int)."""
    return correlation_id if isinstance(correlation_id, str) else int(correlation_id)


class ResponseIterator:
    """The responses of a ``decoupled=True`` call, in order; the last one carries the final flag (and
    may hold no outputs)."""

    _queue: queue.SimpleQueue
    _done: bool
    _call: int

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        if self._done:
            raise StopIteration
        response, final = self._queue.get()
        self._done = final
        return response

    def cancel(self) -> None:
        """Ask the called model to stop: its request.is_cancelled() turns True. What it still sends
        arrives here, up to its final response (a model that ignores the cancellation streams on)."""
        runtime.current().send(Cancel(self._call))


def _iterator(request: InferenceRequest, first: Callable[[], None] | None = None) -> ResponseIterator:
    """``first``: told (on the reader thread) when the first answer is in the iterator."""
    iterator = ResponseIterator.__new__(ResponseIterator)
    iterator._queue = queue.SimpleQueue()
    iterator._done = False

    def deliver(response: InferenceResponse, final: bool) -> None:
        nonlocal first
        iterator._queue.put((response, final))
        if first is not None:
            told, first = first, None
            told()

    iterator._call = _start(request, True, deliver)
    return iterator


def execute(request: InferenceRequest, decoupled: bool) -> Any:
    if decoupled:
        return _iterator(request)
    answer: queue.SimpleQueue = queue.SimpleQueue()
    _start(request, False, lambda response, final: answer.put(response), inline=True)
    runtime.current().wait_inline(lambda: not answer.empty())
    return answer.get()


async def _execute_async(request: InferenceRequest) -> InferenceResponse:
    import asyncio  # loaded by the coroutine's own loop already; a model without coroutines never loads it

    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def deliver(response: InferenceResponse, final: bool) -> None:
        loop.call_soon_threadsafe(_settle, future, response)

    _start(request, False, deliver)
    return await future


def _settle(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


async def _iterate_async(request: InferenceRequest) -> ResponseIterator:
    """As Triton's (``exec`` in an executor): the iterator once the first response is in, awaited
    without holding the event loop, so other coroutines (other requests of an async execute()) run
    meanwhile; a model whose responses all come at once then iterates without ever blocking the loop."""
    import asyncio  # loaded by the coroutine's own loop already; a model without coroutines never loads it

    loop = asyncio.get_running_loop()
    arrived: asyncio.Future = loop.create_future()

    def first() -> None:
        loop.call_soon_threadsafe(_settle, arrived, None)

    iterator = _iterator(request, first)
    await arrived
    return iterator


def execute_async(request: InferenceRequest, decoupled: bool) -> Any:
    return _iterate_async(request) if decoupled else _execute_async(request)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    return bool(runtime.current().ask("model_ready", model_name, str(model_version)))


def load_model(model_name: str, config: str = "", files: dict | None = None) -> None:
    """Load (or reload) a model (explicit model control mode), with ``config`` (JSON) overriding its
    config.pbtxt and, with ``files`` (``{"file:1/model.onnx": b"..."}``, which need ``config``), from those
    files: the server keeps them as it keeps a push over the load API (confined names, bounded sizes)."""
    rt = runtime.current()
    if not files:
        rt.ask("load", model_name, config)
        return
    if not isinstance(files, dict):
        raise TritonModelException(f"files must be a dict of 'file:<path>' names to bytes, not {type(files).__name__}")
    pairs = []
    for key, data in files.items():
        if not isinstance(key, str) or not isinstance(data, (bytes, bytearray, memoryview)):
            raise TritonModelException(
                f"files must map 'file:<path>' names (str) to their contents (bytes); got {type(key).__name__} -> "
                f"{type(data).__name__}")
        pairs.append((key, np.frombuffer(data, dtype=np.uint8)))
    # Always in a block, however small: the daemon checks each file's size from its descriptor.
    ref, descriptors = rt.blocks.write(pairs) if pairs else (None, [])
    try:
        rt.ask("load", model_name, config, ref, descriptors)
    finally:
        if ref is not None:  # the daemon has copied the files out by its answer
            rt.blocks.free(ref[0])


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    runtime.current().ask("unload", model_name, bool(unload_dependents))
