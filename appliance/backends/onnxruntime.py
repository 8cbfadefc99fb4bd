"""ONNX models on onnxruntime."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from appliance.backends.base import Backend, LoadContext
from appliance.core.errors import ConfigError, InferenceFailed, InvalidInput, RefusedByRuntime
from appliance.core.tensors import RuntimeTensor, v2_datatype

__all__ = ["SPINNING", "OnnxRuntimeBackend"]

SPINNING = "session.intra_op.allow_spinning"

# onnxruntime names its tensor types as numpy names dtypes ("tensor(int64)"), but for these.
_ORT_NAMES = {"float": "FP32", "double": "FP64", "string": "BYTES", "bfloat16": "BF16"}


def _v2_datatype(ort_type: str) -> str | None:
    """Triton's datatype of an onnxruntime type ("tensor(float)"); None for one this server cannot serve."""
    name = ort_type.removeprefix("tensor(").removesuffix(")")
    if name in _ORT_NAMES:
        return _ORT_NAMES[name]
    try:
        return v2_datatype(np.dtype(name))
    except (TypeError, ValueError):  # not a numpy name (uint4, float8e4m3fn, seq(...)) or no v2 type (complex64)
        return None


def _describe(args: Sequence[ort.NodeArg]) -> list[RuntimeTensor]:
    tensors = []
    for arg in args:
        datatype = _v2_datatype(arg.type)
        if datatype is None:
            raise ConfigError(f"tensor {arg.name!r} has type {arg.type}, which this server cannot serve")
        shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or []))
        tensors.append(RuntimeTensor(arg.name, datatype, shape))
    return tensors


def _status(error: Exception) -> str:
    """The runtime's own words after its boilerplate ("... Status Message: stoll" -> "stoll")."""
    text = str(error)
    return text.rpartition("Status Message:")[2].strip()[:200] or text[:200]


def _to_strings(array: np.ndarray) -> np.ndarray:
    try:
        return np.array([item.decode("utf-8") for item in array.ravel()], dtype=object).reshape(array.shape)
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"BYTES input is not UTF-8 text, which ONNX string tensors need: {exc}") from exc


def _to_bytes(array: np.ndarray) -> np.ndarray:
    return np.array([str(item).encode("utf-8") for item in array.ravel()], dtype=object).reshape(array.shape)


class OnnxRuntimeBackend(Backend):
    def __init__(self, context: LoadContext) -> None:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3  # errors only: warnings reach users as our own messages
        if context.threads:
            options.intra_op_num_threads = context.threads
        # A pool's threads wait for work by blocking, not by spinning (onnxruntime's default): a spinning
        # thread holds a core for a while after every run, which the event loop, the decoding and the other
        # instances need. bench.peers, the CNN on two threads unpinned: 11.2 against 20.8 ms of CPU a JSON
        # request at c=1, 4.0 against 5.2 over gRPC at c=16, the throughput the same or better.
        options.add_session_config_entry(SPINNING, "0")
        available = set(ort.get_available_providers())
        pinned = context.parameter("onnx_provider")  # set by a selection plan
        if pinned is not None and pinned not in available:
            raise ConfigError(f"onnxruntime execution provider {pinned} is not available on this box")
        wanted = [pinned] if pinned else [p for p in context.options.onnx_providers if p in available]
        providers: list = wanted or ["CPUExecutionProvider"]
        device = context.parameter("onnx_provider_device")
        if device and providers[0] == "OpenVINOExecutionProvider":
            providers = [("OpenVINOExecutionProvider", {"device_type": device})]
        model_path = str(context.model_file)
        if context.artefacts is not None and providers == ["CPUExecutionProvider"]:
            # The graph optimised for this box is kept in the model cache and reused on the next start.
            optimized = context.artefacts / "model.optimized.onnx"
            if optimized.exists():
                model_path = str(optimized)
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            else:
                options.optimized_model_filepath = str(optimized)
        try:
            self._session = ort.InferenceSession(model_path, options, providers=providers)
        except (ort_state.Fail, ort_state.InvalidGraph, ort_state.InvalidProtobuf,
                ort_state.NoSuchFile, ort_state.NotImplemented, ort_state.InvalidArgument) as exc:
            raise ConfigError(f"onnxruntime cannot load {context.model_file}: {exc}") from exc
        self._inputs = _describe(self._session.get_inputs())
        self._outputs = _describe(self._session.get_outputs())
        self._string_inputs = {t.name for t in self._inputs if t.datatype == "BYTES"}
        self._string_outputs = {t.name for t in self._outputs if t.datatype == "BYTES"}

    def inputs(self) -> Sequence[RuntimeTensor]:
        return self._inputs

    def outputs(self) -> Sequence[RuntimeTensor]:
        return self._outputs

    def run(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        feed = {
            name: _to_strings(array) if name in self._string_inputs else array
            for name, array in inputs.items()
        }
        try:
            results = self._session.run(list(outputs), feed)
        except (ort_state.InvalidArgument, ort_state.Fail) as exc:
            raise RefusedByRuntime(f"onnxruntime refused the input: {exc}") from exc
        except Exception as exc:  # the runtime's own exception types vary by provider
            if self._string_inputs and "Cast node" in str(exc):
                # A graph that parses its BYTES inputs as numbers (Cast from string) got text that is not one.
                raise RefusedByRuntime(f"the model could not read a BYTES input as a number ({_status(exc)}); send "
                                       "each element as the text of a number, such as '12' or '-0.5'") from exc
            raise InferenceFailed(f"onnxruntime failed to execute the model: {exc}") from exc
        return {
            name: _to_bytes(value) if name in self._string_outputs else value
            for name, value in zip(outputs, results)
        }
