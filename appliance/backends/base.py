"""The one small interface every runtime implements.

A backend instance is one loaded copy of one model version on one device. The core calls ``run`` from a
thread that belongs to that instance alone, so a backend never needs its own locking.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from appliance.errors import BackendUnavailable
from appliance.tensors import RuntimeTensor

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

__all__ = ["Backend", "BackendInfo", "LoadContext", "RuntimeOptions", "threads_per_instance", "usable_cores"]


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """The daemon-wide runtime choices a backend may use (from Settings)."""

    onnx_providers: tuple[str, ...] = ("CPUExecutionProvider",)
    intra_op_threads: int = 0


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def threads_per_instance(options: RuntimeOptions, instances: int) -> int:
    """Share this box's cores among a model's instances unless the settings fix a number."""
    if options.intra_op_threads:
        return options.intra_op_threads
    return max(1, usable_cores() // max(instances, 1))


@dataclasses.dataclass(frozen=True, slots=True)
class LoadContext:
    """Everything a backend needs to load one instance of one model version."""

    model_name: str
    version: int
    model_file: Path
    config: ModelConfig
    options: RuntimeOptions
    instance_index: int = 0
    threads: int = 0
    """Threads this instance may use inside one operator (0 = the runtime's default)."""
    artefacts: Path | None = None
    """A model-cache directory where the runtime keeps (and on later starts finds) compiled artefacts."""

    @property
    def version_dir(self) -> Path:
        return self.model_file.parent

    def parameter(self, key: str) -> str | None:
        """A string parameter of the model config (where plans and users pass runtime options)."""
        value = self.config.parameters.get(key)
        return value.string_value if value is not None and value.string_value else None


class Backend(abc.ABC):
    """One loaded model instance."""

    @abc.abstractmethod
    def inputs(self) -> Sequence[RuntimeTensor] | None:
        """The runtime's description of the model inputs; None when the file does not say (the
        config must then declare them)."""

    @abc.abstractmethod
    def outputs(self) -> Sequence[RuntimeTensor] | None:
        """The runtime's description of the model outputs; None when the file does not say."""

    @abc.abstractmethod
    def run(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        """Execute one batch. BYTES tensors are numpy object arrays of ``bytes`` both ways.

        Raise ``appliance.errors.InvalidInput`` for input the runtime refuses and
        ``appliance.errors.InferenceFailed`` for anything else that goes wrong.
        """

    def close(self) -> None:  # noqa: B027 - most runtimes free themselves when dropped
        """Release what the instance holds."""

    def completed_config(self, config: ModelConfig) -> ModelConfig:
        """The config as the model itself completes it (Triton's Python ``auto_complete_config``);
        most runtimes leave that to the core and return it unchanged."""
        return config

    def configure(self, config: ModelConfig) -> None:  # noqa: B027 - only some backends care
        """Called once with the final, auto-completed config before the first run."""

    #: True for backends that take a batch as separate requests (Triton's Python backend API)
    #: rather than as concatenated tensors; they implement ``run_requests``.
    takes_requests: bool = False

    def run_requests(
        self, requests: Sequence[Mapping[str, np.ndarray]], outputs: Sequence[Sequence[str]],
        parameters: Sequence[Mapping[str, object]],
    ) -> list[dict[str, np.ndarray] | BaseException]:
        """Execute several requests in one call; one result (or the error for it) per request."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True, slots=True)
class BackendInfo:
    """How to find and load a backend; the runtime module is imported only when a model needs it."""

    name: str
    platforms: tuple[str, ...]
    default_filename: str
    module: str
    factory: str
    extra: str
    cpu_instances: int = 1
    """Instances per CPU instance group when the config names no count (Triton: 2 for onnxruntime)."""

    @property
    def platform(self) -> str:
        return self.platforms[0]

    def load(self, context: LoadContext) -> Backend:
        try:
            module = importlib.import_module(self.module)
        except ImportError as exc:
            raise BackendUnavailable(
                f"backend {self.name!r} is unavailable: {exc.name or exc} is not installed; "
                f"install the '{self.extra}' extra (pip install 'edge-appliance[{self.extra}]')"
            ) from exc
        return getattr(module, self.factory)(context)
