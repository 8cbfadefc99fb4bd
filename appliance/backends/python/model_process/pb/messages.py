"""Requests, responses and response senders, as model.py files see them."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from appliance.backends.python.model_process.pb import runtime
from appliance.backends.python.model_process.pb.errors import TritonModelException
from appliance.backends.python.model_process.pb.request_options import InferenceTrace, PreferredMemory
from appliance.backends.python.model_process.pb.response import InferenceResponse, parameters_json, text_argument
from appliance.backends.python.model_process.pb.tensor import Tensor
from appliance.backends.python.model_process.pb.transfer import send_response

__all__ = ["InferenceRequest", "InferenceResponse", "ResponseSender", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
           "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START", "TRITONSERVER_REQUEST_RELEASE_ALL",
           "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE", "TRITONSERVER_RESPONSE_COMPLETE_FINAL"]

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
_UNTRACED = InferenceTrace()


class Tally:
    """Responses a sender has sent (the final flag alone included)."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent = 0


class ResponseSender:
    """Sends the responses of one request: for a decoupled model any number, from any thread, during or
    after execute(), the last one carrying TRITONSERVER_RESPONSE_COMPLETE_FINAL; for a model that is not
    decoupled exactly one response (with the final flag, or followed by it), execute() returning None
    (or None in that request's place), as Triton allows."""

    def __init__(self, key: int, decoupled: bool = True) -> None:
        self._key = key
        self._decoupled = decoupled
        self._closed = False
        self.tally = Tally()
        """What it has sent: kept apart so that a watch on the sender (``unanswered``) reads it after the
        sender is gone."""
        self._lock = threading.Lock()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if response is None and flags == 0:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(f"send() takes a pb_utils.InferenceResponse, not {type(response).__name__}")
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        with self._lock:
            self._count(response is not None, final)
            send_response(self._key, response, final)

    def _count(self, with_response: bool, final: bool) -> None:
        """Triton's rules (its words), under the lock."""
        if not self._decoupled:
            if with_response and self.tally.sent > 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one response.")
            if not with_response and final and self.tally.sent == 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete final before sending a "
                    "response.")
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        self._closed = final
        self.tally.sent += 1

    def close(self) -> None:
        """execute() failed: its requests were answered with the error; as in Triton, nothing may follow."""
        with self._lock:
            self._closed = True

    def returned(self) -> None:
        """execute() returned a response for this request (a model that is not decoupled): it counts as
        sent with the final flag, as in Triton."""
        with self._lock:
            self._count(True, True)

    def is_cancelled(self) -> bool:
        return bool(runtime.current().ask("cancelled", self._key))


class InferenceRequest:
    """A request the server hands to execute(), or one a model builds to call another model (BLS)."""

    def __init__(self, request_id: str = "", correlation_id: int | str = 0, *, inputs: Iterable[Tensor],
                 requested_output_names: Iterable[str], model_name: str = "", model_version: int = -1,
                 flags: int = 0, timeout: int = 0, preferred_memory: PreferredMemory | None = None,
                 trace: InferenceTrace | None = None, parameters: dict | str | None = None) -> None:
        if preferred_memory is not None and not isinstance(preferred_memory, PreferredMemory):
            raise TritonModelException(f"preferred_memory must be a pb_utils.PreferredMemory, not "
                                       f"{type(preferred_memory).__name__}")
        if trace is not None and not isinstance(trace, InferenceTrace):
            raise TritonModelException(f"trace must be a pb_utils.InferenceTrace, not {type(trace).__name__}")
        self.preferred_memory = preferred_memory or PreferredMemory.default()
        tensors = list(inputs)
        for tensor in tensors:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(f"inputs must hold pb_utils.Tensor objects, not {type(tensor).__name__}")
        self._fill(tensors, [text_argument(name, "requested_output_names") for name in requested_output_names],
                   text_argument(request_id, "request_id"), correlation_id, int(flags), int(timeout),
                   parameters_json(parameters), trace or InferenceTrace(), text_argument(model_name, "model_name"),
                   int(model_version))

    def _fill(self, inputs: list[Tensor], requested: list[str], request_id: str, correlation_id: int | str,
              flags: int, timeout: int, parameters: str, trace: InferenceTrace, model_name: str, model_version: int,
              key: int | None = None, decoupled: bool = True) -> None:
        """Every attribute, from checked values (``__init__``'s, or the server's in ``served``)."""
        self._inputs = inputs
        self._requested = requested
        self._id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._timeout = timeout
        self._parameters = parameters
        self._trace = trace
        self.model_name = model_name
        self.model_version = model_version
        self._key = key  # set on the requests the server hands to execute()
        self._decoupled = decoupled
        self._sender: ResponseSender | None = None
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    @classmethod
    def served(cls, item: tuple, inputs: list[Tensor], decoupled: bool = True) -> InferenceRequest:
        """A request of the batch the daemon sent to execute(), from its ``Item`` (key, input descriptors,
        outputs, id, correlation id, flags, timeout, parameters) and its input tensors (``decoupled``: the
        model's transaction policy, which sets its response sender's rules). Built without ``__init__``'s
        checks: the server made ``item``, and every request passes here."""
        key, _, outputs, request_id, correlation_id, flags, timeout, parameters = item
        request = cls.__new__(cls)
        request._fill(inputs, list(outputs), request_id, correlation_id, flags, timeout, parameters or "{}", _UNTRACED,
                      "", -1, key, decoupled)
        return request

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._requested

    def request_id(self) -> str:
        return self._id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = int(flags)

    def timeout(self) -> int:
        """The client's timeout in microseconds (0 when it set none)."""
        return self._timeout

    def parameters(self) -> str:
        """JSON text, as in Triton."""
        return self._parameters

    def trace(self) -> InferenceTrace:
        """Triton's ``InferenceTrace``: ``get_context()`` is None here (no trace context reaches a model)."""
        return self._trace

    def get_response_sender(self) -> ResponseSender:
        if self._key is None:
            raise TritonModelException("only a request the server passed to execute() has a response sender")
        if self._sender is None:
            if not self._decoupled:
                # Its inputs are views of the input arena, which the next batch overwrites: a model that
                # answers after execute() returned must still read this request's own inputs.
                for tensor in self._inputs:
                    tensor.detach()
            self._sender = ResponseSender(self._key, self._decoupled)
        return self._sender

    @property
    def answered(self) -> bool:
        """Its response sender has sent a response (or the final flag)."""
        return self._sender is not None and self._sender.tally.sent > 0

    def close_sender(self) -> None:
        """execute() failed: the request has its error; a response sent after it raises in the model, as in
        Triton (whose stub closes every sender of a failed batch), rather than reaching the daemon."""
        if self._key is None:
            return
        if self._sender is None:
            self._sender = ResponseSender(self._key, self._decoupled)  # closed at once: its inputs stay as they are
        self._sender.close()

    def is_cancelled(self) -> bool:
        if self._key is None:
            return False
        return bool(runtime.current().ask("cancelled", self._key))

    def set_release_flags(self, flags: int) -> None:
        """TRITONSERVER_REQUEST_RELEASE_RESCHEDULE: run this request again in a later batch, once execute()
        returns (a model with ``sequence_batching { iterative_sequence: true }``); RELEASE_ALL (the default):
        the request is done when its response is."""
        if flags not in (TRITONSERVER_REQUEST_RELEASE_ALL, TRITONSERVER_REQUEST_RELEASE_RESCHEDULE):
            raise TritonModelException(
                f"release flags must be TRITONSERVER_REQUEST_RELEASE_ALL ({TRITONSERVER_REQUEST_RELEASE_ALL}) or "
                f"TRITONSERVER_REQUEST_RELEASE_RESCHEDULE ({TRITONSERVER_REQUEST_RELEASE_RESCHEDULE}), got {flags!r}")
        self._release_flags = int(flags)

    def release_flags(self) -> int:
        return self._release_flags

    # -- BLS -----------------------------------------------------------------------------------

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on ``model_name`` through the server and wait: the InferenceResponse (an
        error comes back as ``response.has_error()``), or with ``decoupled=True`` an iterator of them."""
        from appliance.backends.python.model_process.pb.bls import execute

        return execute(self, decoupled)

    def async_exec(self, decoupled: bool = False) -> Any:
        """As ``exec``, awaitable (the call does not hold the event loop)."""
        from appliance.backends.python.model_process.pb.bls import execute_async

        return execute_async(self, decoupled)
