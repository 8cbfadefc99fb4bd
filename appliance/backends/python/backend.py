"""The daemon's side of the Python backend: one model process per instance.

The model process is started with ``python -m appliance.backends.python.stub`` (not fork: the daemon
has threads and runtimes loaded), talks over a socket pair, and exchanges tensors through shared-memory
arenas. A model process that dies fails the requests it was running and is started again for the next
batch; a model that raises fails only the batch it was given.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
from google.protobuf import json_format

from appliance.backends.base import Backend, BackendRequest, BatchResult, LoadContext
from appliance.backends.python.arena import Arena
from appliance.config_json import config_to_json
from appliance.errors import ApplianceError, ConfigError, InferenceFailed

__all__ = ["PythonBackend"]

log = logging.getLogger(__name__)

# TritonError codes -> HTTP status of the request that got them.
_ERROR_STATUS = {2: HTTPStatus.NOT_FOUND, 3: HTTPStatus.BAD_REQUEST, 4: HTTPStatus.SERVICE_UNAVAILABLE,
                 5: HTTPStatus.BAD_REQUEST}


class ModelError(ApplianceError):
    """An error a model.py returned for one request (InferenceResponse(error=TritonError(...)))."""

    def __init__(self, message: str, status: HTTPStatus) -> None:
        super().__init__(message)
        self.status = status


class _ModelProcess:
    """One running model.py process and its control connection."""

    def __init__(self, context: LoadContext) -> None:
        parent, child = socket.socketpair()
        env = dict(os.environ)
        if context.threads:
            env["OMP_NUM_THREADS"] = str(context.threads)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "appliance.backends.python.stub", str(child.fileno()), str(context.model_file)],
            pass_fds=(child.fileno(),), env=env,
        )
        child.close()
        self.conn = Connection(parent.detach())
        self.output_arena: Arena | None = None

    def call(self, message: tuple) -> tuple:
        self.conn.send(message)
        return self.receive()

    def receive(self) -> tuple:
        try:
            reply = self.conn.recv()
        except (EOFError, OSError):
            code = self.process.wait()
            raise InferenceFailed(
                f"the model process exited with code {code} while handling the request; it is restarted "
                "for the next request"
            ) from None
        if reply[0] == "crashed":
            raise ConfigError(f"model.py failed: {reply[1]}\n{reply[2]}")
        return reply

    def outputs(self, info: dict) -> Arena:
        if self.output_arena is None or self.output_arena.path != info["path"]:
            self._drop_output_arena()
            self.output_arena = Arena.attach(info["path"], info["size"])
        return self.output_arena

    def _drop_output_arena(self) -> None:
        if self.output_arena is not None:
            self.output_arena.close()
            try:  # the model process made it; remove it in case that process cannot
                os.unlink(self.output_arena.path)
            except FileNotFoundError:
                pass
            self.output_arena = None

    def stop(self, timeout: float = 5.0) -> None:
        if self.process.poll() is None:
            try:
                self.conn.send(("finalize",))
                self.conn.poll(timeout) and self.conn.recv()
            except (EOFError, OSError):
                pass
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.conn.close()
        self._drop_output_arena()


class PythonBackend(Backend):
    """A batch reaches model.py's execute() as separate requests, as in Triton; each may fail alone."""

    def __init__(self, context: LoadContext) -> None:
        self._context = context
        self._inputs_arena: Arena | None = None
        self._process: _ModelProcess | None = None
        self._config_json: dict = {}
        process = _ModelProcess(context)
        try:
            _, described = process.call(("describe", config_to_json(context.config)))
        except BaseException:
            process.stop()
            raise
        self._process = process
        self._described = described
        self._ready = False

    def inputs(self) -> None:
        return None  # a model.py declares its tensors in config.pbtxt or auto_complete_config()

    def outputs(self) -> None:
        return None

    def completed_config(self, config: Any) -> Any:
        """The config after the model's own auto_complete_config()."""
        completed = type(config)()
        try:
            json_format.ParseDict(self._described, completed, ignore_unknown_fields=True)
        except json_format.ParseError as exc:
            raise ConfigError(
                f"auto_complete_config() of {self._context.model_file} made an invalid config: {exc}"
            ) from exc
        return completed

    def _args(self) -> dict[str, str]:
        context = self._context
        return {
            "model_config": json.dumps(self._config_json),
            "model_instance_kind": "CPU",
            "model_instance_name": f"{context.model_name}_{context.instance_index}",
            "model_instance_device_id": "0",
            "model_repository": str(context.version_dir.parent),
            "model_version": str(context.version),
            "model_name": context.model_name,
        }

    def configure(self, config: Any) -> None:
        """Initialize the model with the final (auto-completed) config."""
        self._config_json = config_to_json(config)
        self._initialize()

    def _initialize(self) -> None:
        assert self._process is not None
        reply = self._process.call(("initialize", self._args()))
        if reply[0] != "ready":
            raise ConfigError(f"model.py initialize() failed: {reply}")
        self._ready = True

    def _restart(self) -> None:
        if self._process is not None:
            self._process.stop(timeout=1)
        log.warning("restarting the model process of %s (instance %d)", self._context.model_name,
                    self._context.instance_index)
        self._process = _ModelProcess(self._context)
        self._process.call(("describe", self._config_json))
        self._initialize()

    def run(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        (result,) = self.run_requests([BackendRequest(inputs, outputs)]).results
        if isinstance(result, BaseException):
            raise result
        return result

    def run_requests(self, requests: Sequence[BackendRequest]) -> BatchResult:
        if self._process is None or self._process.process.poll() is not None or not self._ready:
            self._restart()
        assert self._process is not None
        tensors = [list(r.inputs.items()) for r in requests]
        needed = sum(Arena.needed(t) for t in tensors)
        if self._inputs_arena is None or self._inputs_arena.size < needed:
            if self._inputs_arena is not None:
                self._inputs_arena.close()
            self._inputs_arena = Arena.create(needed * 2)
        batch, offset = [], 0
        for request, request_tensors in zip(requests, tensors):
            descriptors, offset = self._inputs_arena.write(request_tensors, offset)
            batch.append({"inputs": descriptors, "outputs": list(request.outputs),
                          "parameters": dict(request.parameters)})
        try:
            reply = self._process.call(("execute", self._inputs_arena.info(), batch))
        except InferenceFailed:
            self._ready = False
            raise
        if reply[0] == "failed":
            raise InferenceFailed(f"model.py execute() failed: {reply[1]}")
        _, arena_info, packed = reply
        arena = self._process.outputs(arena_info)
        results: list[dict[str, np.ndarray] | BaseException] = []
        for item in packed:
            if item[0] == "error":
                results.append(ModelError(item[1], _ERROR_STATUS.get(item[2], HTTPStatus.INTERNAL_SERVER_ERROR)))
            else:
                results.append({d[0]: arena.read(d, copy=True) for d in item[1]})
        return BatchResult(results)

    def close(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None
        if self._inputs_arena is not None:
            self._inputs_arena.close()
            self._inputs_arena = None
