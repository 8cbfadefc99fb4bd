"""The requests a model process holds, by key: what its streamed responses and is_cancelled() refer to.

A request to a model that is not decoupled is open while its batch executes, or, when the model answers
it through its response sender, until that response comes; one to a decoupled model until its final
response (which may come long after execute() returned, from any thread of the model).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from http import HTTPStatus

from appliance.backends.base import BackendRequest, Outputs, RequestResult, Reschedule, ResponseSink
from appliance.backends.python.wire.arena import Attachments, taken
from appliance.backends.python.wire.messages import Response
from appliance.core.errors import ApplianceError

__all__ = ["SENT", "ModelError", "OpenRequests", "model_error"]

log = logging.getLogger(__name__)

# TritonError codes -> (HTTP status, gRPC status) as Triton maps them (http_server.cc, grpc_utils.cc).
_STATUS: dict[int, tuple[HTTPStatus, str]] = {
    0: (HTTPStatus.BAD_REQUEST, "UNKNOWN"),
    1: (HTTPStatus.INTERNAL_SERVER_ERROR, "INTERNAL"),
    2: (HTTPStatus.NOT_FOUND, "NOT_FOUND"),
    3: (HTTPStatus.BAD_REQUEST, "INVALID_ARGUMENT"),
    4: (HTTPStatus.SERVICE_UNAVAILABLE, "UNAVAILABLE"),
    5: (HTTPStatus.NOT_IMPLEMENTED, "UNIMPLEMENTED"),
    6: (HTTPStatus.BAD_REQUEST, "ALREADY_EXISTS"),
    7: (HTTPStatus.BAD_REQUEST, "CANCELLED"),
}


class ModelError(ApplianceError):
    """An error a model.py returned for one request (``InferenceResponse(error=TritonError(...))``)."""

    from_model = True

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code
        self.status, self.grpc_code = _STATUS.get(code, _STATUS[1])


def model_error(error: tuple[str, int]) -> ModelError:
    return ModelError(error[0], error[1])


class _Sent:
    """The result execute() gave for a request it answers (or answered) through its response sender."""

    __slots__ = ()


SENT = _Sent()


@dataclasses.dataclass(eq=False, slots=True)
class _Open:
    sink: ResponseSink | None
    cancelled: Callable[[], bool]
    padding: bool
    """Only what later messages need, not the request (its inputs): a decoupled model that never sends
    its final flag keeps its entry, which must stay small."""
    streamed: bool
    """Its responses go to request.sink (a decoupled model)."""
    executing: bool = True
    """Its batch is still in execute(): if the process dies now, the batch's error reaches it."""
    answer: Future | None = None
    """A request that does not stream: the response its sender sent (the first one counts)."""

    def answered(self) -> Future:
        if self.answer is None:
            self.answer = Future()
        return self.answer


class OpenRequests:
    """Keys for the requests of each batch, and the streamed responses that come back for them."""

    def __init__(self, model: str, attachments: Attachments, free: Callable[[int], None]) -> None:
        self._model = model
        self._attachments = attachments
        self._free = free
        """Tells the model process it may reuse a block (after its tensors were copied out)."""
        self._keys = itertools.count(1)
        self._open: dict[int, _Open] = {}
        self._lock = threading.Lock()

    def open(self, requests: Sequence[BackendRequest], streamed: bool) -> list[int]:
        with self._lock:
            keys = [next(self._keys) for _ in requests]
            for key, request in zip(keys, requests):
                self._open[key] = _Open(request.sink, request.cancelled, request.padding,
                                        streamed and request.sink is not None)
        return keys

    def finish_batch(self, keys: Sequence[int], results: list[RequestResult | _Sent]) -> list[RequestResult]:
        """After execute() (``results``: one per request: outputs, error, SENT or RESCHEDULE; changed in
        place and returned): a request that does not stream is closed, unless its response sender is
        still to answer (its result is then a future of that answer); a streaming one stays open until its
        final response, unless execute() failed or rescheduled it (the core then sends the error, then
        final; or runs it again under a new key). A streaming request that has sent its final response
        already gets an empty result: its sink has had everything. A request its sender answered keeps that
        answer whatever execute() did afterwards (Triton: the first response reached the client)."""
        with self._lock:
            for index, key in enumerate(keys):
                entry = self._open.get(key)
                if entry is None:  # streamed, and final already sent: its sink has had everything
                    results[index] = {}
                    continue
                entry.executing = False
                result = results[index]
                if entry.padding:  # nobody waits for what the model makes of it
                    del self._open[key]
                    results[index] = {}
                    continue
                if entry.streamed:
                    if isinstance(result, (BaseException, Reschedule)):
                        del self._open[key]
                    elif isinstance(result, _Sent):
                        results[index] = {}
                    continue
                if isinstance(result, _Sent) or entry.answer is not None:
                    answer = entry.answered()
                    if not answer.done():
                        results[index] = answer  # the sender answers later, from another thread
                        continue
                    error = answer.exception()
                    results[index] = error if error is not None else answer.result()
                del self._open[key]
        return results  # type: ignore[return-value]  # no _Sent is left

    def cancelled(self, key: int) -> bool:
        with self._lock:
            entry = self._open.get(key)
        return entry is not None and bool(entry.cancelled())

    def on_response(self, message: Response) -> Awaitable[object] | None:
        """A streamed response (sent through a response sender). On the reader
        thread its sink may block while the client is behind; on the event loop it never does: the wait
        for room comes back instead, and the channel is read no further until it completes."""
        key, ref, descriptors, error, parameters, final = message
        outputs = taken(self._attachments, ref, descriptors) if ref is not None or descriptors else None
        if ref is not None:
            self._free(ref[0])
        flag_only = outputs is None and error is None and parameters is None  # send(flags=FINAL) alone
        params = _parameters(parameters)
        with self._lock:
            entry = self._open.get(key)
            if entry is not None and not entry.streamed:
                if not flag_only:
                    self._answer(key, entry, outputs, error, params)
                return None
            if entry is not None and final:
                del self._open[key]
        if entry is None or entry.sink is None:
            if not flag_only:  # a flag alone may close a request its sender answered already
                log.warning("model %s sent a response for a request that is already complete; dropped", self._model)
            return None
        deliver = entry.sink.offer if asyncio._get_running_loop() is not None else entry.sink.send
        if error is not None:
            return deliver(None, error=model_error(error), parameters=params, final=final)
        return deliver(Outputs(outputs or {}, params) if outputs is not None else None, parameters=params,
                       final=final)

    def _answer(self, key: int, entry: _Open, outputs: dict | None, error: tuple[str, int] | None,
                params: dict[str, object]) -> None:
        """Under the lock: the response a sender sent for a request that does not stream is its answer
        (the model process lets through one response, then the final flag alone)."""
        answer = entry.answered()
        if not answer.done():
            if error is not None:
                answer.set_exception(model_error(error))
            else:
                answer.set_result(Outputs(outputs or {}, params))
        if not entry.executing:  # finish_batch has handed the future on
            del self._open[key]

    def fail_all(self, reason: str) -> None:
        """The model process is gone: every streaming request still open ends with an error, and so does
        every request still waiting for its sender's answer (those of the batch in execute() get theirs
        from it)."""
        with self._lock:
            entries = [entry for entry in self._open.values() if not entry.executing]
            self._open = {key: entry for key, entry in self._open.items() if entry.executing}
        for entry in entries:
            if entry.streamed and entry.sink is not None:  # now, even past a client that reads nothing
                entry.sink.fail(ModelError(reason, 1))
            elif entry.answer is not None and not entry.answer.done():
                entry.answer.set_exception(ModelError(reason, 1))


def _parameters(text: str | None) -> dict[str, object]:
    return json.loads(text) if text else {}
