"""What a model process asks of the daemon, served on the daemon's side: BLS calls (through the daemon's
own data plane), questions (is_cancelled, is_model_ready, load/unload), log records and custom metrics.

Runs on whatever reads the process's channel (its reader thread, or the event loop once the channel is
handed over) and never blocks it on a model: a BLS call is handed to the data plane, and its answer is
sent when the call completes (on the event loop's thread).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from http import HTTPStatus
from typing import Any

import numpy as np

from appliance.backends.base import (
    CALLS_UNAVAILABLE,
    BackendServices,
    ModelCall,
    ModelCalls,
    Outputs,
    StreamedCall,
)
from appliance.backends.python.process import Handler
from appliance.backends.python.requests import ModelError, OpenRequests
from appliance.backends.python.wire.arena import Attachments, BlockRef, Blocks, Descriptor, carry, taken
from appliance.backends.python.wire.messages import (
    Answer,
    Ask,
    Cancel,
    Free,
    Infer,
    Log,
    Message,
    MetricUpdate,
    Response,
    Result,
)
from appliance.core.errors import ApplianceError, NotSupported, PushRefused, PushTooLarge

__all__ = ["Peer"]

# HTTP status of an error -> the TritonError code a model sees in response.error().code().
_CODES = {HTTPStatus.NOT_FOUND: 2, HTTPStatus.BAD_REQUEST: 3, HTTPStatus.SERVICE_UNAVAILABLE: 4,
          HTTPStatus.GATEWAY_TIMEOUT: 4,
          HTTPStatus.NOT_IMPLEMENTED: 5, HTTPStatus.CONFLICT: 6}


_GRPC_CODES = {"UNKNOWN": 0, "ALREADY_EXISTS": 6, "CANCELLED": 7}
_MAX_FILES = 1000
"""Files one load_model() may carry (as a load request's file overrides)."""


def _error(exc: BaseException) -> tuple[str, int]:
    if isinstance(exc, ModelError):
        return exc.message, exc.code
    if isinstance(exc, ApplianceError) and exc.grpc_code in _GRPC_CODES:
        return exc.message, _GRPC_CODES[exc.grpc_code]
    if isinstance(exc, ApplianceError):
        return exc.message, _CODES.get(exc.status, 1)
    return f"{type(exc).__name__}: {exc}", 1


class _CallSink:
    """The responses of a decoupled BLS call, sent back to the model process as they come."""

    def __init__(self, peer: Peer, call: int) -> None:
        self._peer, self._call = peer, call

    def send(self, outputs: Mapping[str, np.ndarray] | None = None, *, error: BaseException | None = None,
             parameters: Mapping[str, object] | None = None, final: bool = False) -> None:
        self._peer.send_result(self._call, outputs, error, parameters, final)
        if final:
            self._peer.forget(self._call)

    def offer(self, outputs: Mapping[str, np.ndarray] | None = None, *, error: BaseException | None = None,
              parameters: Mapping[str, object] | None = None, final: bool = False) -> None:
        """Never waits: the model process's channel takes it (``send``)."""
        self.send(outputs, error=error, parameters=parameters, final=final)

    def fail(self, error: BaseException) -> None:
        self.send(None, error=error, final=True)


class Peer:
    def __init__(self, model: str, send: Callable[[Message], None], requests: OpenRequests,
                 services: BackendServices | None) -> None:
        self._model = model
        self._send = send
        self._requests = requests
        self._services = services or BackendServices()
        self.blocks = Blocks(model)
        """Where the daemon writes BLS outputs for the model process."""
        self.attachments = Attachments()
        """The model process's blocks, as the daemon reads them."""
        self._streams: dict[int, StreamedCall] = {}
        self._lock = threading.Lock()
        self._log = logging.getLogger(f"appliance.model.{model}")

    def handlers(self) -> dict[type[Message], Handler]:
        return {Infer: self.on_infer, Cancel: self.on_cancel, Ask: self.on_ask, Free: self.on_free, Log: self.on_log,
                MetricUpdate: self.on_metric, Response: self._requests.on_response}

    # -- BLS -------------------------------------------------------------------------------------

    def on_infer(self, message: Infer) -> None:
        call, ref, descriptors, meta = message
        models = self._services.models
        try:  # (what the model process sent: anything malformed is answered, never left without an answer)
            for block in meta.get("released", ()):
                self.blocks.free(block)
            inputs = taken(self.attachments, ref, descriptors)
            if models is None:
                self.send_result(call, None, ModelError(CALLS_UNAVAILABLE, 5), None, True)
                return
            text = meta.get("parameters")
            parameters = json.loads(text) if text and text != "{}" else {}  # (a call's are mostly none)
            if type(parameters) is not dict:
                raise TypeError(f"parameters are a JSON object, not {type(parameters).__name__}")
            request = ModelCall(meta["model_name"], inputs, tuple(meta["outputs"]), int(meta["model_version"]),
                                meta.get("id") or "", meta.get("correlation_id") or 0, int(meta.get("flags") or 0),
                                int(meta.get("timeout") or 0), parameters)
            if type(request.model_name) is not str or type(request.request_id) is not str:
                raise TypeError("model_name and id are strings")
            if type(request.correlation_id) not in (int, str) or not all(type(o) is str for o in request.outputs):
                raise TypeError("correlation_id is a number or a string, and outputs are names")
        except (AttributeError, KeyError, TypeError, ValueError, OverflowError) as exc:  # (int() of an infinity)
            self.send_result(call, None, ModelError(f"invalid BLS request: {exc}", 3), None, True)
            return
        if meta.get("decoupled"):
            streamed = models.stream(request, _CallSink(self, call))
            with self._lock:
                self._streams[call] = streamed
            return
        models.begin(request, functools.partial(self._answer_infer, call))

    def _answer_infer(self, call: int, outputs: Outputs | None, error: BaseException | None) -> None:
        if error is not None:
            self.send_result(call, None, error, None, True)
            return
        assert outputs is not None
        self.send_result(call, outputs, None, outputs.parameters, True)

    def send_result(self, call: int, outputs: Mapping[str, np.ndarray] | None, error: BaseException | None,
                    parameters: Mapping[str, object] | None, final: bool) -> None:
        ref: BlockRef | None = None
        descriptors: list[Descriptor] = []
        if error is None and outputs:
            try:
                ref, descriptors = carry(self.blocks, list(outputs.items()))
            except Exception as exc:  # noqa: BLE001 - e.g. an output numpy cannot lay out
                error = exc
        answer = _error(error) if error is not None else None
        params = json.dumps(dict(parameters)) if parameters else None
        self._send(Result(call, ref, descriptors, answer, params, final))

    def forget(self, call: int) -> None:
        with self._lock:
            self._streams.pop(call, None)

    def on_cancel(self, message: Cancel) -> None:
        """``ResponseIterator.cancel()``: the called model is asked to stop; what it still sends arrives."""
        with self._lock:
            streamed = self._streams.get(message.call)
        if streamed is not None:
            streamed.cancel()

    def on_free(self, message: Free) -> None:
        for block in message.blocks:
            self.blocks.free(block)

    # -- questions -------------------------------------------------------------------------------

    def on_ask(self, message: Ask) -> None:
        call, what, args = message
        try:
            value = self._answer(what, args)
        except (ApplianceError, ValueError, KeyError, TypeError) as exc:
            self._send(Answer(call, False, getattr(exc, "message", None) or str(exc)))
            return
        if isinstance(value, Future):
            value.add_done_callback(lambda done: self._answer_later(call, done))
            return
        self._send(Answer(call, True, value))

    def _answer_later(self, call: int, future: Future) -> None:
        error = future.exception()
        if error is not None:
            self._send(Answer(call, False, _error(error)[0]))
        else:
            self._send(Answer(call, True, future.result()))

    def _answer(self, what: str, args: tuple) -> Any:
        if what == "cancelled":
            return self._requests.cancelled(args[0])
        metrics = self._services.metrics
        if what.startswith("metric"):
            if metrics is None:
                raise ValueError("custom metrics are not available here (the daemon runs with --no-metrics)")
            if what == "metric_family":
                return metrics.family(self, *args)
            if what == "metric":
                return metrics.metric(self, *args)
            return metrics.value(args[0])
        models = self._services.models
        if models is None:
            raise ValueError(f"{what} is not available here: this backend was loaded without the server")
        if what == "model_ready":
            return models.ready(*args)
        if what == "load":
            return models.load(*self._load_args(models, args))
        if what == "unload":
            return models.unload(*args)
        raise ValueError(f"unknown question {what!r}")

    def _load_args(self, models: ModelCalls, args: tuple) -> tuple[str, str, dict[str, bytes] | None]:
        """(name, config, files) of a load_model(): the files travel in a block of the model process, and
        are copied out only once their count and sizes are within what the box keeps of a push."""
        name, config, *attached = args
        if not attached:
            return name, config, None
        ref, descriptors = attached
        limits = models.push_limits()
        if limits is None:
            raise NotSupported("this box keeps no pushed models (its state dir is not writable); put the files in "
                               "the repository, or make the state dir writable and restart the daemon")
        max_file, max_total = limits
        refused = f"failed to load '{name}', failed to poll from model repository: "
        if len(descriptors) > _MAX_FILES or any(d[1] != "UINT8" or len(d[2]) != 1 for d in descriptors):
            raise PushRefused(refused + f"load_model takes at most {_MAX_FILES} files, each bytes")
        for descriptor in descriptors:
            if descriptor[4] > max_file:
                raise PushTooLarge(refused + f"file override {descriptor[0][:120]!r} has {descriptor[4]} bytes, more "
                                   f"than push_max_file_bytes ({max_file}); raise the setting on the box or load a "
                                   "smaller file")
        if sum(d[4] for d in descriptors) > max_total:
            raise PushTooLarge(refused + f"the files hold more than push_max_total_bytes ({max_total}) together")
        arrays = self.attachments.read(ref, descriptors) if ref is not None else {}
        return name, config, {key: array.tobytes() for key, array in arrays.items()}

    # -- logs and metrics ------------------------------------------------------------------------

    def on_log(self, message: Log) -> None:
        level, text, filename, line = message
        self._log.log(level, "%s:%s] %s", filename, line, text)

    def on_metric(self, message: MetricUpdate) -> None:
        operation, metric_id, value = message
        if self._services.metrics is not None:
            self._services.metrics.update(metric_id, operation, value)

    def close(self) -> None:
        """The model process is gone: its streams are cancelled, its metrics dropped."""
        with self._lock:
            streams = list(self._streams.values())
            self._streams.clear()
        for streamed in streams:
            streamed.abandon()
        if self._services.metrics is not None:
            self._services.metrics.release(self)
        self.blocks.close()
        self.attachments.close()

