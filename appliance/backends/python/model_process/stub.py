"""The model process: loads a Triton model.py and serves the daemon's commands.

Run by the daemon as ``python -m appliance.backends.python.model_process.stub READ_FD,WRITE_FD MODEL_FILE DAEMON_PID``,
the descriptors its end of the channel (``channel``: a pipe each way). The main thread runs the commands
(describe, initialize, execute, finalize) in order, and reads the channel itself while it waits for the
next one; a reader thread reads while it runs one and the model's own calls (BLS, is_cancelled) wait for
answers (see ``reading``). Whichever reads the end of the channel ends the process: the daemon went
away. Tensors travel through shared-memory arenas.
"""

from __future__ import annotations

import ctypes
import importlib
import inspect
import json
import logging
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from appliance.backends.python.model_process import triton_python_backend_utils as pb_utils
from appliance.backends.python.model_process.pb import runtime
from appliance.backends.python.model_process.pb.logger import forward_logging
from appliance.backends.python.model_process.pb.runtime import Runtime
from appliance.backends.python.model_process.pb.transfer import error_of, tensors_of
from appliance.backends.python.model_process.pb.unanswered import NOT_A_LIST, NOT_A_RESPONSE, Unanswered
from appliance.backends.python.model_process.reading import Reading
from appliance.backends.python.wire import messages as wire
from appliance.backends.python.wire.arena import Arena, pack, read_tensor
from appliance.backends.python.wire.channel import Channel

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger("appliance.python-stub")

_PR_SET_PDEATHSIG = 1


def _die_with(daemon_pid: int) -> None:
    """Be killed when the daemon dies, however it dies (SIGKILL included). The daemon starts model
    processes from a thread that lives as long as it does (PR_SET_PDEATHSIG follows the forking
    thread); the reader thread's end-of-file on the channel is the second, portable guard."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != daemon_pid:  # it died before the prctl took effect
        os._exit(0)


def _load_model_class(model_file: Path) -> type:
    """Import model.py as Triton does: as module ``model`` of package ``<version>``, with the version
    directory and the model directory on sys.path, so that relative imports and sibling modules work."""
    sys.modules["triton_python_backend_utils"] = pb_utils
    version_dir = model_file.parent
    sys.path.append(str(version_dir))
    sys.path.append(str(version_dir.parent))
    module = importlib.import_module(f"{version_dir.name}.{model_file.stem}")
    model_class = getattr(module, "TritonPythonModel", None)
    if model_class is None:
        raise AttributeError(f"{model_file} defines no class TritonPythonModel")
    return model_class


def _auto_complete(model_class: type, config: dict) -> dict:
    hook = getattr(model_class, "auto_complete_config", None)
    if hook is None:
        return config
    result = hook(pb_utils.ModelConfig(config))
    return result.as_dict() if isinstance(result, pb_utils.ModelConfig) else config


class _Attached:
    """The daemon's input arenas (it writes batches into two in turn), attached as they show up; one the
    daemon replaced (it grew) is let go of."""

    KEEP = 3
    """The two in use, and the one a grown arena replaced (let go of one batch later)."""

    def __init__(self) -> None:
        self.arenas: dict[str, Arena] = {}

    def get(self, info: dict | None) -> Arena | None:
        """The arena ``info`` names (None: the batch's inputs travel inline)."""
        if info is None:
            return None
        arena = self.arenas.get(info["path"])
        if arena is None:
            arena = self.arenas[info["path"]] = Arena.attach(info["path"], info["size"])
            while len(self.arenas) > self.KEEP:
                self.arenas.pop(next(iter(self.arenas))).close()
        return arena

    def let_go_if_oversized(self, info: dict | None) -> None:
        """After execute(): an oversized arena held this one batch; the daemon removes it."""
        if info is None:
            return
        arena = self.arenas.get(info["path"])
        if arena is not None and arena.oversized:
            del self.arenas[info["path"]]
            arena.close()


def _requests(arena: Arena | None, batch: list[wire.Item], decoupled: bool) -> list[pb_utils.InferenceRequest]:
    """The batch as model.py sees it. A decoupled model's inputs are detached from the arena (it may
    read them after execute() returned, when the arena holds the next batch)."""
    return [
        pb_utils.InferenceRequest.served(
            item, [pb_utils.Tensor(d[0], read_tensor(arena, d, copy=decoupled)) for d in item[1]], decoupled)
        for item in batch
    ]


class ReturnRefused(pb_utils.TritonModelException):
    """What execute() returned breaks Triton's rules: its message is Triton's own (the C++ stub raises
    these, so they carry no Python type or traceback; see ``what_failed``)."""


SENT = wire.Sent()
"""A request answered through its response sender (now, or later from another thread)."""
RESCHEDULED = wire.Rescheduled()
"""A request the model released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE: it runs again."""


def _unanswered(request: pb_utils.InferenceRequest) -> wire.Sent | wire.Rescheduled:
    rescheduled = request.release_flags() == pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
    return RESCHEDULED if rescheduled else SENT


def returned_entries(decoupled: bool, requests: list, responses: Any, instance: str = "",
                     unanswered: Unanswered | None = None) -> list | None:
    """What execute() returned, checked with Triton's rules and words: one entry per request, an
    InferenceResponse or SENT/RESCHEDULED; None for a decoupled model that rescheduled nothing. (Also
    the in-process plan's: appliance.backends.python.in_process.) ``instance``: the model instance's name,
    which Triton's messages give. ``unanswered``: where a request of a model that is not decoupled, left
    to its response sender, is watched (it gets an error once let go of unanswered)."""
    entries = _checked_entries(decoupled, requests, responses, instance)
    if unanswered is not None and entries is not None and not decoupled:
        for request, entry in zip(requests, entries):
            if isinstance(entry, wire.Sent):
                unanswered.watch(request, NOT_A_LIST if responses is None else NOT_A_RESPONSE)
    return entries


def _checked_entries(decoupled: bool, requests: list, responses: Any, instance: str) -> list | None:
    if decoupled:
        if responses is not None:
            raise ReturnRefused(
                f"Python model '{instance}' is using the decoupled mode and the execute function must return "
                "None. (Send the responses with request.get_response_sender().)")
        marks = [_unanswered(request) for request in requests]
        return marks if any(isinstance(mark, wire.Rescheduled) for mark in marks) else None
    if responses is None:
        return [_unanswered(request) for request in requests]
    if not isinstance(responses, list):
        raise ReturnRefused(
            f"Expected a list in the execute return, found type '{type(responses)}'.")
    if len(responses) != len(requests):
        raise ReturnRefused(
            "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
            f"InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) size is:{len(responses)}\n")
    entries: list[Any] = []
    for request, response in zip(requests, responses):
        if response is None:
            entries.append(_unanswered(request))
            continue
        if request._release_flags == pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            raise ReturnRefused(
                "Expected a None object in the execute function return list for reschduled request, found type "
                f"'{type(response)}'.")
        if not isinstance(response, pb_utils.InferenceResponse):
            raise ReturnRefused(
                "Expected an 'InferenceResponse' object in the execute function return list, found type "
                f"'{type(response)}'.")
        if request._sender is not None:
            request._sender.returned()  # raises if the sender has answered already, as in Triton
        entries.append(response)
    return entries


_RESPONSE = pb_utils.InferenceResponse


def _pack_responses(responses: list, arena: Arena | None,
                    model: str) -> tuple[list[wire.Entry], Arena | None, dict | None]:
    """Every response's tensors, inline when small, else written into the output arena (``pack``, growing
    it): one entry per response, Produced or Errored; requests answered elsewhere (Sent, Rescheduled) keep
    their marks. Also the output arena, and its ``info()`` when the entries are in it (else None)."""
    tensors: list[list[tuple[str, Any]]] = []
    packed: list[Any] = []
    for response in responses:
        if type(response) is _RESPONSE and response._error is None:  # the common response, told first
            tensors.append(tensors_of(response._outputs, "output"))
            packed.append(response)
            continue
        if isinstance(response, (wire.Sent, wire.Rescheduled)):
            tensors.append([])
            packed.append(response)
            continue
        try:
            tensors.append([] if response.has_error() else tensors_of(response.output_tensors(), "output"))
        except pb_utils.TritonModelException as exc:
            response = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
            tensors.append([])
        packed.append(response)
    carried, arena, info = pack(tensors, arena, model)
    for index, response in enumerate(packed):
        if type(response) is _RESPONSE and response._error is None:
            packed[index] = wire.Produced(carried[index], response._parameters)
            continue
        if isinstance(response, (wire.Sent, wire.Rescheduled)):
            continue
        error = error_of(response)
        packed[index] = (wire.Errored(*error) if error is not None
                         else wire.Produced(carried[index], response.parameters()))
    return packed, arena, info


class _Model:
    """model.py's TritonPythonModel, with Triton's rules for sync and async execute()."""

    def __init__(self, model_class: type) -> None:
        self.instance = model_class()
        self.decoupled = False
        self.name = ""  # the instance's name, as Triton's messages give it (initialize's model_instance_name)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.unanswered: Unanswered | None = None
        """Requests left to their response senders (set once initialize() gave the instance's name)."""
        self.failures = _Failures()

    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop coroutines run on (a thread of its own, started on first use, as in Triton)."""
        import asyncio  # here and in call(): a model without coroutines never loads it (7 MiB a process)

        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, name="pb-event-loop", daemon=True).start()
        return self._loop

    def call(self, name: str, *args: Any, background: bool = False) -> Any:
        method = getattr(self.instance, name, None)
        if method is None:
            return None
        result = method(*args)
        if type(result) is list or not inspect.iscoroutine(result):  # (execute()'s usual answer, told first)
            return result
        import asyncio

        future = asyncio.run_coroutine_threadsafe(result, self.loop())
        if background:  # a decoupled model's async execute() runs on while the next batch comes
            future.add_done_callback(self._log_background_failure)
            return None
        return future.result()

    def _log_background_failure(self, future: Any) -> None:
        if not future.cancelled() and future.exception() is not None:
            self.failures.log(future.exception(), "async execute() failed: ")


class _Failures:
    """execute()'s failures are logged once per model process: each fails its own requests (with its
    words and traceback), but a line per failure would let any client fill the log."""

    def __init__(self) -> None:
        self._logged = False

    def log(self, exc: BaseException, what: str = "") -> None:
        if self._logged:
            return
        self._logged = True
        log.error("%s%s\n(logged once per model process: later failures of execute() only fail their requests)",
                  what, "".join(traceback.format_exception(exc)).rstrip())


def _failure(exc: BaseException, failures: _Failures | None = None) -> wire.Failed:
    """Logged, unless ``failures`` has logged one already."""
    text = "".join(traceback.format_exception(exc))
    if failures is None:
        log.error("%s", text.rstrip())
    else:
        failures.log(exc)
    return wire.Failed(what_failed(exc), text)


_OURS = str(Path(__file__).resolve().parent)


def what_failed(exc: BaseException) -> str:
    """The exception as Triton's stub reports it (pybind11's error_already_set::what()): its type and
    words, then the frames of the model's own code, innermost first."""
    if isinstance(exc, ReturnRefused):
        return str(exc)
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__)
              if not str(Path(frame.filename).resolve()).startswith(_OURS)]
    where = "".join(f"  {frame.filename}({frame.lineno}): {frame.name}\n" for frame in reversed(frames))
    return f"{type(exc).__name__}: {exc}" + (f"\n\nAt:\n{where}" if where else "")


def _execute(model: _Model, requests: list, rt: Runtime,
             output: Arena | None) -> tuple[wire.Done | wire.Failed, Arena | None]:
    """Done: its entries one per request (see _pack_responses), or None when every request streams its
    responses (a decoupled model that rescheduled nothing); or Failed."""
    try:
        responses = model.call("execute", requests, background=model.decoupled)
        entries = returned_entries(model.decoupled, requests, responses, model.name, model.unanswered)
    except Exception as exc:
        for request in requests:
            request.close_sender()
        return _failure(exc, model.failures), output
    if entries is None:
        return wire.Done(None, None), output
    packed, output, info = _pack_responses(entries, output, rt.model_name)
    return wire.Done(info, packed), output


def _execute_each(model: _Model, requests: list, rt: Runtime,
                  output: Arena | None) -> tuple[wire.Done | wire.Failed, Arena | None]:
    """A group (a model without dynamic batching, never decoupled): execute() once per request, in order,
    each its own execution; one reply for all, where a request whose execute() raised is Failed and the
    others as in _execute."""
    entries: list[Any] = []
    failures: dict[int, wire.Failed] = {}
    for index, request in enumerate(requests):
        try:
            returned = returned_entries(False, [request], model.call("execute", [request]), model.name,
                                        model.unanswered)
            assert returned is not None  # None only for a decoupled model, which is never grouped
            entries.append(returned[0])
        except Exception as exc:
            request.close_sender()
            failures[index] = _failure(exc, model.failures)
            entries.append(SENT)  # a mark _pack_responses passes through; replaced below
    packed, output, info = _pack_responses(entries, output, rt.model_name)
    for index, failure in failures.items():
        packed[index] = failure
    return wire.Done(info, packed), output


def serve(rt: Runtime, commands: Reading, model_file: Path) -> None:
    model_class = _load_model_class(model_file)
    describe = commands.next_command()
    assert isinstance(describe, wire.Describe), describe
    rt.send(wire.Described(_auto_complete(model_class, describe.config)))
    initialize = commands.next_command()
    assert isinstance(initialize, wire.Initialize), initialize
    args = initialize.args
    try:
        model = _Model(model_class)
        model.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        model.name = args.get("model_instance_name", "")
        model.unanswered = Unanswered(rt, model.name)
        model.call("initialize", args)
    except Exception as exc:
        rt.send(_failure(exc))
        return
    rt.send(wire.Ready())
    # Replies are written into two output arenas in turn: the daemon may send the next batch before it
    # has read this one's outputs, but not the one after (it lends the instance twice at most).
    inputs, turn = _Attached(), 0
    outputs: list[Arena | None] = [None, None]
    while True:
        message = commands.next_command()
        if isinstance(message, wire.Finalize):
            break
        assert isinstance(message, (wire.Execute, wire.ExecuteEach)), message
        arena_info, batch = message
        requests = _requests(inputs.get(arena_info), batch, model.decoupled)
        run = _execute_each if isinstance(message, wire.ExecuteEach) else _execute
        reply, outputs[turn] = run(model, requests, rt, outputs[turn])
        del requests  # a request left unanswered, and let go of by the model, is answered now (``unanswered``)
        output = outputs[turn]
        if output is not None and output.oversized:  # the daemon reads it, then removes it
            output.release()
            outputs[turn] = None
        turn ^= 1
        rt.send(reply)
        inputs.let_go_if_oversized(arena_info)
        rt.flush_released()
    try:
        model.call("finalize")
    except Exception as exc:
        _failure(exc)
    for output in outputs:
        if output is not None:
            output.close()
    rt.send(wire.Finalized())


def _dispatch(rt: Runtime, message: wire.Message) -> None:
    """A message of the daemon that is not a command, on the thread that read it."""
    if isinstance(message, wire.Handover):  # the daemon's event loop reads what follows
        rt.send(wire.HandedOver())
    elif isinstance(message, wire.Free):
        for block in message.blocks:
            rt.blocks.free(block)
    else:
        rt.answer(message)


def _gone(rt: Runtime) -> None:
    """The daemon is gone (it stopped, or died): nobody will read what this process makes."""
    rt.fail_calls("the server went away")
    rt.close()
    os._exit(0)


def main() -> None:
    channel, model_file, daemon_pid = Channel.from_argument(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    # The model sees no arguments, as in Triton's stub, whose Python is embedded: unittest.main() in a
    # model.py (Triton's qa models run their tests so) must not take ours for test names.
    del sys.argv[1:]
    _die_with(daemon_pid)
    # A child the model forks must not hold the channel: the daemon would never read its end once this
    # process exits (a lingering child keeps the pipe open), and the child's writes would interleave with
    # this process's frames.
    os.register_at_fork(after_in_child=channel.close)
    rt = Runtime(channel, model_file.parent.parent.name)
    runtime.install(rt)
    forward_logging(rt)
    commands = Reading(rt, lambda message: _dispatch(rt, message), lambda: _gone(rt))
    try:
        serve(rt, commands, model_file)
    except Exception as exc:
        try:
            rt.send(wire.Crashed(f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        except OSError:
            pass
        rt.close()
        raise SystemExit(1) from exc
    rt.close()


if __name__ == "__main__":
    main()
