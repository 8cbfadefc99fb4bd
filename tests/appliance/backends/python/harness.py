"""Load a model.py with the Python backend directly (no daemon, no transport), read a request's answer,
and a sink that records what a decoupled model streams."""

from __future__ import annotations

import contextlib
import dataclasses
import textwrap
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends.base import BackendServices, LoadContext, RuntimeOptions
from appliance.backends.python.backend import PythonBackend


def parse_config(text: str) -> mc.ModelConfig:
    return text_format.Parse(textwrap.dedent(text), mc.ModelConfig())


@contextlib.contextmanager
def loaded(model_file: Path, config: str, services: BackendServices | None = None,
           instance_index: int = 0) -> Iterator[PythonBackend]:
    parsed = parse_config(config)
    parsed.name = parsed.name or model_file.parent.parent.name
    context = LoadContext(parsed.name, 1, model_file, parsed, RuntimeOptions(), instance_index,
                          services=services)
    backend = PythonBackend(context)
    try:
        backend.configure(backend.completed_config(parsed))
        yield backend
    finally:
        backend.close()


def answer_y(result, timeout: float = 10.0) -> list:
    """A request's answer as its output Y's values: ``result`` is what the backend gave for the request (its
    outputs, the error that failed it, or a Future of either); an error is raised."""
    if isinstance(result, Future):
        result = result.result(timeout)
    if isinstance(result, BaseException):
        raise result
    return result["Y"].tolist()


@dataclasses.dataclass
class Sent:
    outputs: dict[str, np.ndarray] | None
    error: BaseException | None
    parameters: dict
    final: bool


class RecordingSink:
    """A ResponseSink that keeps what it is sent; ``wait_final`` blocks until the final response."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []
        self._final = threading.Event()
        self._lock = threading.Lock()

    def send(self, outputs=None, *, error=None, parameters=None, final=False) -> None:
        with self._lock:
            if self._final.is_set():
                raise AssertionError("a response was sent after the final one")
            self.sent.append(Sent(dict(outputs) if outputs is not None else None, error, dict(parameters or {}),
                                  final))
        if final:
            self._final.set()

    def offer(self, outputs=None, *, error=None, parameters=None, final=False) -> None:
        self.send(outputs, error=error, parameters=parameters, final=final)

    def fail(self, error) -> None:
        self.send(None, error=error, final=True)

    def wait_final(self, timeout: float = 30.0) -> list[Sent]:
        assert self._final.wait(timeout), f"no final response within {timeout} s; got {self.sent}"
        return self.sent
