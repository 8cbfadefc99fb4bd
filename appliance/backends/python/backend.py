"""The daemon's side of the Python backend: one model process per instance.

The model process is started with ``python -m appliance.backends.python.model_process.stub`` (not fork: the daemon
has threads and runtimes loaded), talks over a pipe each way (see ``channel``), and exchanges tensors
through shared-memory arenas. A model process that dies fails the requests it was running and is
started again for the next batch; one that dies while it initializes fails the load. A model that
raises fails only the batch it was given; a decoupled model's responses stream to each request's sink.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from appliance.backends.base import (
    RESCHEDULE,
    BackendRequest,
    BatchResult,
    LoadContext,
    Outputs,
    RequestResult,
    model_parameters,
    reschedule_refused,
)
from appliance.backends.python.environment import model_environment
from appliance.backends.python.model_args import initialize_args, instance_name
from appliance.backends.python.model_backend import ModelPyBackend
from appliance.backends.python.peer import Peer
from appliance.backends.python.process import ModelProcess, ProcessExited
from appliance.backends.python.requests import SENT, ModelError, OpenRequests, model_error
from appliance.backends.python.wire.arena import (
    INLINE_BYTES,
    Arena,
    Attachments,
    Descriptor,
    inline,
    pack,
    read_tensor,
)
from appliance.backends.python.wire.messages import (
    Crashed,
    Describe,
    Described,
    Done,
    Errored,
    Execute,
    ExecuteEach,
    Failed,
    Free,
    Initialize,
    Item,
    Message,
    Produced,
    Ready,
    Rescheduled,
    Sent,
)
from appliance.core.config_json import config_to_json
from appliance.core.errors import ConfigError, InferenceFailed
from model_cache.environments import UnpackLimits

__all__ = ["ModelError", "PythonBackend"]

log = logging.getLogger(__name__)

_GROUP = 8
"""Requests of a model without dynamic batching sent to its process in one message (each still its own
execute() there): the channel's cost — the messages, the wake-ups of two processes — is paid per group."""
_START_INPUT_BYTES = 64 * 1024
"""Inputs up to this size are written into the arena on the event loop (``start_requests``): copying
them costs less than the hop to an instance thread; larger ones are copied on the instance's thread.
Inputs that travel inline (at most INLINE_BYTES together) are within it: ``_start`` sizes them once."""
assert INLINE_BYTES <= _START_INPUT_BYTES


def _described(reply: Message) -> dict:
    """The auto-completed config of a Described reply."""
    if not isinstance(reply, Described):
        raise ConfigError(f"the model process answered auto_complete_config() with {type(reply).__name__}")
    return reply.config


class _ExecuteFailed(InferenceFailed):
    """execute() raised: the execution failed as a whole (for a group, that request's own execution)."""


def _failed_batch(results: list[Any], failed: InferenceFailed) -> list[Any]:
    """After execute() raised: the batch failed as a whole (Triton counts the execution, no inference)
    unless a request was answered through its response sender before, whose answer stands."""
    if all(result is failed for result in results):
        raise failed
    return results


def _small(requests: Sequence[BackendRequest], each: bool = False) -> bool:
    """Whether the inputs are cheap to copy on the event loop: at most _START_INPUT_BYTES together (a
    batch), or each request's (``each``: a group, at most _GROUP of them). BYTES tensors are sized only
    when serialized, so they never count as small."""
    total = 0
    for request in requests:
        if each:
            total = 0
        for array in request.inputs.values():
            if array.dtype.hasobject:
                return False
            total += array.nbytes
        if total > _START_INPUT_BYTES:
            return False
    return True


class _Instance:
    """One model process with everything that lives as long as it does."""

    def __init__(self, context: LoadContext) -> None:
        self.requests = OpenRequests(context.model_name, attachments=Attachments(), free=self._free)
        self._freed: list[int] = []
        """Blocks freed on the event loop this turn, sent together at its end."""
        services = context.services
        self.peer = Peer(context.model_name, self._send, self.requests, services)
        environment = model_environment(context, services.environments if services is not None else None,
                                        services.environment_limits if services is not None else UnpackLimits())
        self.process = ModelProcess(context, self.peer.handlers(), environment)
        self.process.on_exit(self._ended)
        self._children = services.processes if services is not None else None
        if self._children is not None:
            self._children.register(self.process)

    def _send(self, message: Message) -> None:
        self.process.send(message)

    def _free(self, block: int) -> None:
        """The daemon is done with one of the model process's blocks. On the event loop the blocks freed in
        one turn of the loop go back in one message (a stream's responses often come several to a turn)."""
        loop = asyncio._get_running_loop()
        if loop is None:
            self.process.send(Free([block]))
            return
        self._freed.append(block)
        if len(self._freed) == 1:
            loop.call_soon(self._send_freed)

    def _send_freed(self) -> None:
        blocks, self._freed = self._freed, []
        self.process.send(Free(blocks))

    def _ended(self) -> None:
        try:
            code: int | None = self.process.process.wait(5)
        except subprocess.TimeoutExpired:  # closed its end of the channel but lingers
            code = None
        self.requests.fail_all(f"the model process of '{self.process.name}' exited with code {code}")
        self.peer.close()

    def stop(self, timeout: float = 5.0) -> None:
        try:
            self.process.stop(timeout)
        finally:
            if self._children is not None:
                self._children.unregister(self.process)


class PythonBackend(ModelPyBackend):
    """A batch reaches model.py's execute() as separate requests, as in Triton; each may fail alone."""

    def __init__(self, context: LoadContext) -> None:
        self._context = context
        self._input_arenas: list[Arena | None] = [None, None]
        """Two, taken in turn: with a batch on its way while one runs (pipeline_depth 2), the next batch's
        inputs must not overwrite those the model is reading. The third batch is sent only once the
        first has answered (the pool lends an instance twice at most)."""
        self._turn = 0
        self._sending = threading.Lock()
        """Held while a batch's inputs are written and it is sent: from the loop and the instance thread."""
        self._config_json: dict = {}
        self._config: Any = None
        """The final, auto-completed config (set by configure)."""
        self._decoupled = False
        self._iterative = False
        """RESCHEDULE is honoured (iterative_sequence); otherwise a rescheduled request fails."""
        self._ready = False
        instance = _Instance(context)
        try:
            described = _described(instance.process.call(Describe(config_to_json(context.config)),
                                                         "running auto_complete_config()"))
        except ProcessExited as exc:
            instance.stop()
            raise ConfigError(f"the model process of '{context.model_name}' exited with code {exc.code} "
                              "while loading model.py") from None
        except BaseException:
            instance.stop()
            raise
        self._instance: _Instance | None = instance
        self._described = described

    def _args(self) -> dict[str, str]:
        return initialize_args(self._context, self._config_json, self._config)

    def configure(self, config: Any) -> None:
        """Initialize the model with the final (auto-completed) config."""
        self._config = config
        self._config_json = config_to_json(config)
        self._decoupled = bool(config.model_transaction_policy.decoupled)
        self._iterative = config.HasField("sequence_batching") and config.sequence_batching.iterative_sequence
        self._initialize()

    def _initialize(self) -> None:
        assert self._instance is not None
        name = self._context.model_name
        try:
            reply = self._instance.process.call(Initialize(self._args()), "running initialize()")
        except ProcessExited as exc:
            raise ConfigError(
                f"the model process of '{name}' exited with code {exc.code} during initialize()"
            ) from None
        if not isinstance(reply, Ready):
            what = reply.what if isinstance(reply, Failed) else f"it answered {type(reply).__name__}"
            raise ConfigError(f"initialize() of model '{name}' failed: {what}")
        self._ready = True

    def check_ready(self) -> None:
        """A model process that died after its initialize() (killed while the other instances loaded)
        is started again before the version is served; if that fails, so does the load."""
        instance = self._instance
        if instance is not None and self._ready and instance.process.alive:
            return
        try:
            self._restart()
        except ProcessExited as exc:
            raise ConfigError(f"the model process of '{self._context.model_name}' exited with code {exc.code} "
                              "while it was started again before serving") from None

    def _restart(self) -> None:
        if self._instance is not None:
            self._instance.stop(timeout=1)
        log.warning("restarting the model process of %s (instance %d)", self._context.model_name,
                    self._context.instance_index)
        self._ready = False
        self._instance = _Instance(self._context)
        _described(self._instance.process.call(Describe(config_to_json(self._context.config)),
                                               "running auto_complete_config()"))
        self._initialize()

    def _write_inputs(self, requests: Sequence[BackendRequest], keys: list[int],
                      inlined: tuple[list, list[list[Descriptor]] | None] | None = None,
                      ) -> tuple[dict | None, list[Item]]:
        """The batch's inputs in the message (small ones: ``inline``) or in an input arena (its ``info()``, else
        None), and one ``Item`` a request for the model process. ``inlined``: the batch's tensors and what
        ``inline`` made of them, where the caller asked it already."""
        tensors, carried = inlined if inlined is not None else ([list(r.inputs.items()) for r in requests], None)
        carried, arena, arena_info = pack(tensors, self._input_arenas[self._turn], self._context.model_name, carried)
        if arena_info is not None:  # in the arena: the next batch takes the other one
            self._input_arenas[self._turn] = arena
            self._turn ^= 1
        batch = [(key, descriptors, list(request.outputs), request.request_id, request.correlation_id, request.flags,
                  request.timeout_us, model_parameters(request.parameters) if request.parameters else "{}")
                 for key, request, descriptors in zip(keys, requests, carried)]
        return arena_info, batch

    @property
    def reads_on_loop(self) -> bool:
        """The model process's channel is read by the event loop (after the first batch started from it)."""
        return self._instance is not None and self._instance.process.reads_on_loop

    @property
    def pipeline_depth(self) -> int:  # type: ignore[override]
        """Two batches on their way at once (the model process queues the second), except for a decoupled
        model: its execute() returns as soon as its responses are on their way, so a second batch queued
        behind it gained nothing measurable (1.03x at c=1 and c=16, within the box's noise)."""
        return 1 if self._decoupled else 2

    @property
    def group_limit(self) -> int:  # type: ignore[override]
        """Groups for models that are not decoupled (a group's reply answers its requests; a decoupled
        model's requests are answered by their streams)."""
        return 1 if self._decoupled else _GROUP

    def run_requests(self, requests: Sequence[BackendRequest]) -> BatchResult:
        if self._instance is None or not self._instance.process.alive or not self._ready:
            self._restart()
        assert self._instance is not None
        instance = self._instance
        keys = instance.requests.open(requests, streamed=self._decoupled)
        results: list[Any]
        replies: queue.SimpleQueue = queue.SimpleQueue()
        # Triton's compute_input / compute_output: handing the inputs to the model process, taking its
        # outputs back; the rest of the call is the model's own time.
        input_ns = output_ns = 0
        try:
            with self._sending:
                started = time.perf_counter_ns()
                arena_info, batch = self._write_inputs(requests, keys)
                input_ns = time.perf_counter_ns() - started
                instance.process.call_async(Execute(arena_info, batch), replies.put)
            reply = replies.get()
            if reply is None:
                code = instance.process.process.wait()
                raise ProcessExited(f"the model process of '{instance.process.name}' exited with code {code} "
                                    "while handling the request", code)
            if isinstance(reply, Crashed):
                raise ConfigError(f"model.py of '{instance.process.name}' failed: {reply.what}\n{reply.traceback}")
        except ProcessExited as exc:
            self._ready = False
            error = InferenceFailed(f"{exc.message}; it is restarted for the next request")
            results = [error for _ in requests]
        else:
            replied = time.perf_counter_ns()
            try:
                results = self._results(reply, len(requests))
            except InferenceFailed as failed:  # execute() raised
                self._let_go_of_inputs(arena_info)
                return BatchResult(_failed_batch(instance.requests.finish_batch(keys, [failed for _ in keys]), failed))
            output_ns = time.perf_counter_ns() - replied
        self._let_go_of_inputs(arena_info)
        return BatchResult(instance.requests.finish_batch(keys, results), input_ns=input_ns, output_ns=output_ns)

    def _let_go_of_inputs(self, info: dict | None) -> None:
        """After a batch: the arena it was written into (``info``, None for inputs carried inline), if larger
        than those kept for reuse, goes (the model process has let go of its view of it too)."""
        if info is None:
            return
        for index, arena in enumerate(self._input_arenas):
            if arena is not None and arena.path == info["path"] and arena.oversized:
                self._input_arenas[index] = None
                arena.close()

    def start_requests(self, requests: Sequence[BackendRequest],
                       done: Callable[[BatchResult | BaseException], None]) -> bool:
        """The event loop writes the inputs (when small) and sends the batch; whoever reads the channel
        (the event loop itself, once handed over) completes the batch with the reply: no instance thread
        waits for the model."""
        return self._start(requests, done, Execute)

    def start_each(self, requests: Sequence[BackendRequest],
                   done: Callable[[BatchResult | BaseException], None]) -> bool:
        """A group in one message: the model process runs execute() once per request, in order, and
        answers them together; a request whose execute() raised fails alone."""
        return self._start(requests, done, ExecuteEach)

    def _start(self, requests: Sequence[BackendRequest], done: Callable[[BatchResult | BaseException], None],
               command: type[Execute] | type[ExecuteEach]) -> bool:
        instance = self._instance
        if instance is None or not self._ready or not instance.process.alive:
            return False  # a restart blocks
        tensors = [list(r.inputs.items()) for r in requests]
        carried = inline(tensors)  # (inputs this small are small: the common batch is sized once)
        if carried is None and not _small(requests, each=command is ExecuteEach):
            return False  # large inputs are copied off the event loop
        if not instance.process.handed_over:  # asked once (get_running_loop costs a getpid() each call)
            try:  # a decoupled model's channel too: while a client is behind, the loop stops reading it
                instance.process.read_on(asyncio.get_running_loop())
            except RuntimeError:  # not called on an event loop: the reader thread reads on
                pass

        input_ns = 0

        def replied(reply: Message | None) -> None:
            try:
                taken = time.perf_counter_ns()
                replies = self._replied(instance, reply, len(requests))
                output_ns = time.perf_counter_ns() - taken
                self._let_go_of_inputs(arena_info)
                raised = (frozenset(i for i, r in enumerate(replies) if isinstance(r, _ExecuteFailed))
                          if command is ExecuteEach else frozenset())  # a group's requests fail alone
                results = instance.requests.finish_batch(keys, replies)
            except BaseException as exc:  # noqa: BLE001 - the batch must complete, whatever happened
                if isinstance(exc, InferenceFailed):  # execute() raised
                    self._let_go_of_inputs(arena_info)
                    try:
                        answered = _failed_batch(instance.requests.finish_batch(keys, [exc for _ in keys]), exc)
                    except InferenceFailed as failed:
                        done(failed)
                        return
                    done(BatchResult(answered))
                    return
                done(exc)
                return
            done(BatchResult(results, input_ns=input_ns, output_ns=output_ns, failed=raised))

        if not self._sending.acquire(blocking=False):
            return False  # the instance thread is writing a large batch: this one follows it there
        try:
            keys = instance.requests.open(requests, streamed=self._decoupled)
            started = time.perf_counter_ns()
            try:
                arena_info, batch = self._write_inputs(requests, keys, (tensors, carried))
            except BaseException as exc:
                instance.requests.finish_batch(keys, [exc for _ in keys])
                raise
            input_ns = time.perf_counter_ns() - started
            instance.process.call_async(command(arena_info, batch), replied)
        finally:
            self._sending.release()
        return True

    def _replied(self, instance: _Instance, reply: Message | None, count: int) -> list[Any]:
        if reply is None:
            self._ready = False
            try:
                code: int | None = instance.process.process.wait(5)
            except subprocess.TimeoutExpired:  # closed its end of the channel but lingers
                code = None
            return [InferenceFailed(f"the model process of '{instance.process.name}' exited with code {code} "
                                    "while handling the request; it is restarted for the next request")
                    for _ in range(count)]
        if isinstance(reply, Crashed):
            raise ConfigError(f"model.py of '{instance.process.name}' failed: {reply.what}\n{reply.traceback}")
        return self._results(reply, count, instance)

    def _results(self, reply: Message, count: int, instance: _Instance | None = None) -> list[Any]:
        """One result per request: outputs, error, RESCHEDULE, or SENT (its response sender answers it:
        ``OpenRequests.finish_batch`` puts the answer, or a future of it, in its place)."""
        instance = instance or self._instance
        assert instance is not None
        if isinstance(reply, Failed):
            # The batch failed as a whole (Triton counts the execution, but no inference), in its words.
            raise self._execute_failed(reply.what)
        if not isinstance(reply, Done):
            raise InferenceFailed(f"the model process of '{instance.process.name}' answered a batch with "
                                  f"{type(reply).__name__}")
        arena_info, packed = reply
        if packed is None:  # decoupled: the responses went to the sinks
            return [{} for _ in range(count)]
        arena = instance.process.outputs(arena_info) if arena_info is not None else None
        results: list[RequestResult | object] = []
        for item in packed:
            if type(item) is Produced:  # the common entry, told first (a class pattern costs more)
                descriptors, text = item
                results.append(Outputs({d[0]: read_tensor(arena, d, copy=True) for d in descriptors},
                                       json.loads(text) if text and text != "{}" else None))
                continue
            match item:
                case Errored(message, code):
                    results.append(model_error((message, code)))
                case Sent():
                    results.append(SENT)
                case Failed(what):  # a request of a group (ExecuteEach) whose own execute() raised
                    results.append(self._execute_failed(what))
                case Rescheduled():
                    results.append(RESCHEDULE if self._iterative else reschedule_refused(self._context.model_name))
        if arena is not None and arena.oversized:  # read (copied): the model process let go of it already
            instance.process.drop_output_arena(arena.path)
        return results

    def _execute_failed(self, what: str) -> _ExecuteFailed:
        return _ExecuteFailed(f"Failed to process the request(s) for model "
                              f"'{instance_name(self._context, self._config)}', message: {what}")

    def close(self) -> None:
        if self._instance is not None:
            self._instance.stop()
            self._instance = None
        for index, arena in enumerate(self._input_arenas):
            if arena is not None:
                arena.close()
                self._input_arenas[index] = None

