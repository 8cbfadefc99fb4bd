"""Requests nobody can answer any more: execute() of a model that is not decoupled returned None for them
(``None``, or None in their place), they were not answered through their response sender, and the model
let go of both the request and its sender. Triton deletes the response factory then and sends nothing,
so such a request would wait for ever; here it gets Triton's error for what execute() returned (the words
its stub used before None meant "answered through the sender"), and the model serves on.

A request the model keeps (a thread that answers later, a list it holds) stays open: it may still be
answered, and the daemon's request deadline, or the client's own timeout, bounds the wait.

Watching costs a ``weakref.finalize`` per request left unanswered when execute() returned. The finalizer
may run on any thread at any allocation (the cyclic collector), even one holding a lock of the channel,
so it only queues (``SimpleQueue.put`` is safe there); a thread of its own, started on first use, sends.
"""

from __future__ import annotations

import logging
import queue
import threading
import weakref
from typing import TYPE_CHECKING

from appliance.backends.python.wire.messages import Response

if TYPE_CHECKING:
    from appliance.backends.python.model_process.pb.messages import InferenceRequest
    from appliance.backends.python.model_process.pb.runtime import Runtime

__all__ = ["NOT_A_LIST", "NOT_A_RESPONSE", "Unanswered"]

log = logging.getLogger("appliance.python-stub")

NOT_A_LIST = "Expected a list in the execute return, found type '<class 'NoneType'>'."
"""Triton's words for execute() returning None (python_backend's stub, before 24.07)."""
NOT_A_RESPONSE = ("Expected an 'InferenceResponse' object in the execute function return list, found type "
                  "'<class 'NoneType'>'.")
"""Triton's words for None in a request's place in the list execute() returned."""
_HOW = (" (execute() returned None for this request and let go of it unanswered: return a list with one "
        "InferenceResponse per request, or send the response with request.get_response_sender())")
_CODE = 1
"""TritonError.INTERNAL: HTTP 500, gRPC INTERNAL, as Triton answers a failed execute()."""
_STOP = None


class Unanswered:
    """The watch over one model instance's requests (one per model process, or per in-process backend)."""

    def __init__(self, rt: Runtime, instance: str) -> None:
        """``instance``: the model instance's name, as Triton's message gives it."""
        self._rt = rt
        self.instance = instance
        self._let_go: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._logged = False

    def watch(self, request: InferenceRequest, what: str) -> None:
        """``request`` was left to its response sender (``what``: NOT_A_LIST or NOT_A_RESPONSE, which
        execute() did): once it and its sender are let go of without a response, it gets the error."""
        sender = request.get_response_sender()  # its inputs are detached: a late answer may still read them
        if sender.tally.sent:
            return
        self._start()
        # The sender outlives its request (the request holds it); the finalizer holds only the tally.
        finalizer = weakref.finalize(sender, self._let_go.put, (request._key, what, sender.tally))
        finalizer.atexit = False

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._answer, name="pb-unanswered", daemon=True)
                self._thread.start()

    def _answer(self) -> None:
        while True:
            item = self._let_go.get()
            if item is _STOP:
                return
            key, what, tally = item
            if tally.sent:  # answered before it was let go of
                continue
            message = f"Failed to process the request(s) for model '{self.instance}', message: {what}{_HOW}"
            if not self._logged:  # once per instance: a line per request would let a client fill the log
                self._logged = True
                log.error("%s; later requests of this instance let go of unanswered get the same error, unlogged",
                          message)
            try:
                self._rt.send(Response(key, None, [], (message, _CODE), None, True))
            except Exception:  # noqa: BLE001 - the daemon went away: nobody waits for the answer
                log.debug("could not answer request %s: the daemon is gone", key)

    def close(self) -> None:
        """Stop the thread (an in-process backend that is closed; a model process just exits)."""
        with self._lock:
            if self._thread is not None:
                self._let_go.put(_STOP)
                self._thread = None
