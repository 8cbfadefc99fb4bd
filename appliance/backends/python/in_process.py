"""The in-process plan: a model.py the operator trusts, run inside the daemon, with no process hop.

Offered only where the config says so (``parameters { key: "in_process" value: { string_value: "true" } }``)
and measured by selection beside the default plan (a process per instance, Triton's isolation), which
stays the reference and the default. Loaded only when selection serves or measures that plan
(``LoadContext.plan``, see appliance.backends.python.factory): no config parameter loads it.

Here ``execute()`` runs on the instance's thread with the request's own arrays; pb_utils calls that need
the server (BLS, ``is_cancelled()``, custom metrics, ``Logger``) go to the same daemon-side handlers as a
model process's messages (``Peer``), by plain calls instead of a channel.

What isolation no longer gives: an exception in ``execute()`` still fails only its batch, and an error
response only its request; but a model that hangs holds its instance (its requests wait, others do not)
and one that crashes the interpreter (a segfault, ``os._exit``) takes the daemon with it. pb_utils calls
from threads the model starts itself do not reach the server; decoupled models are not offered this plan.

A batch may even run on the event loop's own thread, with no hop at all, when selection measured it
within the loop's budget (``holds_gil``: a Python ``execute()`` holds the GIL, so a thread would not run
it beside the loop anyway; see appliance.engine.scheduler.execution). Nothing may wait there for the
loop: a model whose model.py names a call that waits for other models (``exec``, ``async_exec``,
``load_model``, ``unload_model``) or whose ``execute`` is a coroutine never runs there, and a call that
waits, made from there anyway (through another module), is refused: it raises in the model, that batch
fails, and every later batch runs on the instance's thread.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import itertools
import json
import logging
import re
import sys
import threading
import types
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn, cast

from appliance.backends.base import (
    BackendRequest,
    BatchResult,
    LoadContext,
    Outputs,
    model_parameters,
    reschedule_refused,
)
from appliance.backends.python.model_args import initialize_args, instance_name
from appliance.backends.python.model_backend import ModelPyBackend
from appliance.backends.python.model_process import triton_python_backend_utils as pb_utils
from appliance.backends.python.model_process.pb import runtime
from appliance.backends.python.model_process.pb.runtime import Runtime
from appliance.backends.python.model_process.pb.transfer import error_of, tensors_of
from appliance.backends.python.model_process.pb.unanswered import Unanswered
from appliance.backends.python.model_process.stub import returned_entries, what_failed
from appliance.backends.python.peer import Peer
from appliance.backends.python.requests import SENT, OpenRequests, model_error
from appliance.backends.python.wire.arena import Attachments
from appliance.backends.python.wire.channel import Channel
from appliance.backends.python.wire.messages import Ask, Free, Infer, Message, Rescheduled, Sent
from appliance.core.config_json import config_to_json
from appliance.core.errors import ConfigError, InferenceFailed

__all__ = ["InProcessPythonBackend"]

log = logging.getLogger(__name__)

_WAITING_CALLS = frozenset({"exec", "async_exec", "load_model", "unload_model"})
"""pb_utils calls whose answer needs the event loop (another model's run, a load): never made from it."""
_WAITING_QUESTIONS = frozenset({"load", "unload"})
_ON_THE_LOOP = ("called another model, or loaded one, from execute() while it ran on the event loop, where nothing "
                "may wait; that batch failed, and every later one runs on the instance's thread (retry the request)")

_IMPORT_LOCK = threading.Lock()
_LOADS = itertools.count(1)


def _load_model_class(context: LoadContext) -> type:
    """Import model.py under a package name of its own (two models' ``1/model.py`` must not collide in
    the daemon's sys.modules): relative imports resolve inside its version directory, and, as in a
    model process, the version and model directories are on sys.path for sibling modules."""
    sys.modules.setdefault("triton_python_backend_utils", pb_utils)
    version_dir = context.version_dir
    # A number of its own per load (an object's id may be reused once it is gone): a reload, or another
    # model's instance, never finds an earlier import's modules (its relative imports included).
    package = "_appliance_model_" + re.sub(r"\W", "_", f"{context.model_name}_{context.version}_{next(_LOADS)}")
    with _IMPORT_LOCK:
        for path in (str(version_dir), str(version_dir.parent)):
            if path not in sys.path:
                sys.path.append(path)
        parent = types.ModuleType(package)
        parent.__path__ = [str(version_dir)]
        sys.modules[package] = parent
        name = f"{package}.{context.model_file.stem}"
        spec = importlib.util.spec_from_file_location(name, context.model_file)
        if spec is None or spec.loader is None:
            raise ConfigError(f"cannot import {context.model_file}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            sys.modules.pop(package, None)
            raise
    model_class = getattr(module, "TritonPythonModel", None)
    if model_class is None:
        raise ConfigError(f"{context.model_file} defines no class TritonPythonModel")
    return model_class


class _LocalRuntime(Runtime):
    """The model's end of the 'channel' in the daemon: what it sends is handled at once by the
    daemon-side handlers, and what they answer comes straight back."""

    def __init__(self, model_name: str) -> None:
        # No connection: send() below replaces it.
        super().__init__(cast(Channel, None), model_name)
        self.handlers: Mapping[type[Message], Any] = {}
        self.on_loop = False
        """execute() runs on the event loop's thread: a call that waits for the loop is refused."""
        self.refused = False
        """Such a call was refused."""

    def send(self, message: Message) -> None:
        handler = self.handlers.get(type(message))
        if handler is None:
            raise InferenceFailed(f"model {self.model_name}: the server takes no {type(message).__name__} message")
        if self.on_loop and isinstance(message, (Infer, Ask)) and _waits(message):
            self._refuse(message)
        handler(message)

    def _refuse(self, message: Infer | Ask) -> NoReturn:
        """A call that would wait for the event loop, from the event loop: it never starts (its inputs and
        the blocks it gave back are let go of), and the model gets an exception."""
        self.refused = True
        with self._calls_lock:
            self._calls.pop(message.call, None)
        if isinstance(message, Infer):
            if message.ref is not None:
                self.blocks.free(message.ref[0])
            if message.meta.get("released"):
                self.handlers[Free](Free(message.meta["released"]))
        raise pb_utils.TritonModelException(f"model {self.model_name} {_ON_THE_LOOP}")

    def receive(self, message: Message) -> None:
        """What the daemon-side handlers send to the model."""
        if isinstance(message, Free):
            for block in message.blocks:
                self.blocks.free(block)
        else:
            self.answer(message)


def _waits(message: Infer | Ask) -> bool:
    return isinstance(message, Infer) or (isinstance(message, Ask) and message.what in _WAITING_QUESTIONS)


def _names_waiting_calls(context: LoadContext) -> bool:
    """Whether model.py's code names a pb_utils call that waits for other models (anywhere: functions,
    methods, lambdas, comprehensions)."""
    try:
        code = compile(context.model_file.read_bytes(), str(context.model_file), "exec")
    except (OSError, SyntaxError, ValueError):  # it imported, so this is unexpected: stay off the loop
        return True
    todo = [code]
    while todo:
        current = todo.pop()
        if _WAITING_CALLS.intersection(current.co_names):
            return True
        todo += [const for const in current.co_consts if isinstance(const, types.CodeType)]
    return False


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class InProcessPythonBackend(ModelPyBackend):
    """A batch reaches execute() as separate requests, as in Triton; each may fail alone."""

    holds_gil = True

    def __init__(self, context: LoadContext) -> None:
        self._context = context
        self._runtime = _LocalRuntime(context.model_name)
        self._requests = OpenRequests(context.model_name, attachments=Attachments(), free=lambda block: None)
        self._peer = Peer(context.model_name, self._runtime.receive, self._requests, context.services)
        self._runtime.handlers = self._peer.handlers()
        self._loop: asyncio.AbstractEventLoop | None = None
        with runtime.serving(self._runtime):
            try:
                self._class = _load_model_class(context)
                self._described = self._auto_complete(config_to_json(context.config))
            except ConfigError:
                raise
            except Exception as exc:
                raise ConfigError(f"loading {context.model_file} failed: {type(exc).__name__}: {exc}") from exc
        self._model: Any = None
        self._instance = instance_name(context)
        """Triton's name of the instance, which its error messages give (set again from the final config)."""
        self._unanswered = Unanswered(self._runtime, self._instance)
        self._failure_logged = False
        if inspect.iscoroutinefunction(getattr(self._class, "execute", None)):
            self.inline_safe = False
            self.inline_refusal = "execute() is a coroutine: it is awaited on a loop of the instance's own"
        elif _names_waiting_calls(context):
            self.inline_safe = False
            self.inline_refusal = (f"{context.model_file.name} calls other models (BLS) or loads them, which waits "
                                   "for the event loop")
        else:
            self.inline_safe = True

    def _auto_complete(self, config: dict) -> dict:
        hook = getattr(self._class, "auto_complete_config", None)
        if hook is None:
            return config
        result = hook(pb_utils.ModelConfig(config))
        return result.as_dict() if isinstance(result, pb_utils.ModelConfig) else config

    def configure(self, config: Any) -> None:
        self._instance = self._unanswered.instance = instance_name(self._context, config)
        with runtime.serving(self._runtime):
            try:
                self._model = self._class()
                self._call("initialize", initialize_args(self._context, config_to_json(config), config))
            except Exception as exc:
                raise ConfigError(f"initialize() of model '{self._context.model_name}' failed: "
                                  f"{type(exc).__name__}: {exc}") from exc

    def _call(self, name: str, *args: Any) -> Any:
        method = getattr(self._model, name, None)
        if method is None:
            return None
        result = method(*args)
        if inspect.iscoroutine(result):  # async def execute: awaited on this instance's own loop
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            result = self._loop.run_until_complete(result)
        return result

    def run_requests(self, requests: Sequence[BackendRequest]) -> BatchResult:
        if self._model is None:  # measured by selection, which runs a backend without configure()
            self.configure(self._context.config)
        keys = self._requests.open(requests, streamed=False)
        served = [
            pb_utils.InferenceRequest.served(
                (key, None, r.outputs, r.request_id, r.correlation_id, r.flags, r.timeout_us,
                 model_parameters(r.parameters)),
                [pb_utils.Tensor(name, array) for name, array in r.inputs.items()], False)
            for key, r in zip(keys, requests)
        ]
        results: list[Any]
        self._runtime.on_loop = _on_event_loop()
        try:
            with runtime.serving(self._runtime):
                entries = returned_entries(False, served, self._call("execute", served), self._instance,
                                           self._unanswered)
        except Exception as exc:  # noqa: BLE001 - the batch fails, as a model process's would
            for request in served:
                request.close_sender()
            if not self._failure_logged:  # once: a line per failed batch would let any client fill the log
                self._failure_logged = True
                log.error("model %s: execute() failed (logged once per instance: later failures only fail their "
                          "requests)", self._context.model_name, exc_info=True)
            error = InferenceFailed(f"Failed to process the request(s) for model '{self._instance}', message: "
                                    f"{what_failed(exc)}")
            results = [error for _ in requests]
        else:
            results = [self._result(entry) for entry in entries or ()]
        finally:
            self._runtime.on_loop = False
            if self._runtime.refused:
                self.inline_safe = False
                self.inline_refusal = f"its model {_ON_THE_LOOP}"
        return BatchResult(self._requests.finish_batch(keys, results))

    def _result(self, entry: Any) -> Any:
        """A request's result from what execute() gave for it: its outputs, its error, SENT (its response
        sender answers it), or a refused reschedule (iterative sequences run in a process)."""
        if isinstance(entry, Sent):
            return SENT
        if isinstance(entry, Rescheduled):
            return reschedule_refused(self._context.model_name)
        error = error_of(entry)
        if error is not None:
            return model_error(error)
        try:
            tensors = dict(tensors_of(entry.output_tensors(), "output"))
        except pb_utils.TritonModelException as exc:
            return model_error((str(exc), pb_utils.TritonError.INTERNAL))
        parameters = entry.parameters()
        return Outputs(tensors, json.loads(parameters) if parameters not in ("", "{}") else None)

    def close(self) -> None:
        if self._model is not None:
            with runtime.serving(self._runtime):
                try:
                    self._call("finalize")
                except Exception:
                    log.exception("model %s: finalize() failed", self._context.model_name)
            self._model = None
        if self._loop is not None:
            self._loop.close()
            self._loop = None
        self._unanswered.close()
        self._peer.close()
        self._runtime.close()
