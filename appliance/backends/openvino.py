"""OpenVINO IR (model.xml + model.bin), or an ONNX file read directly, on an OpenVINO device."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import openvino as ov

from appliance.backends.base import Backend, LoadContext
from appliance.core.errors import ConfigError, InferenceFailed, InvalidInput
from appliance.core.tensors import RuntimeTensor

__all__ = ["OpenVinoBackend", "openvino_reason"]

# OpenVINO's errors are a stack of frames ("Exception from src/...cpp:117:", "Check 'x' failed at ...",
# "Details:", "Not Implemented:") around one or two lines that say what is wrong.
_FRAME = re.compile(r"^(Exception from \S+:\d+:|Check '.*' failed at \S+:|Details:|Not Implemented:)$")
_MAX_REASON = 300

_OV_TO_V2 = {
    "boolean": "BOOL",
    "u8": "UINT8",
    "u16": "UINT16",
    "u32": "UINT32",
    "u64": "UINT64",
    "i8": "INT8",
    "i16": "INT16",
    "i32": "INT32",
    "i64": "INT64",
    "f16": "FP16",
    "f32": "FP32",
    "f64": "FP64",
    "bf16": "BF16",
}


def openvino_reason(exc: BaseException) -> str:
    """What an OpenVINO error says, on one line: the frames dropped, the rest joined, bounded. (A failed
    candidate's 15-line stack printed twice on every first start of the example repository.)"""
    lines = [line.strip() for line in str(exc).splitlines()]
    reasons = list(dict.fromkeys(line for line in lines if line and not _FRAME.match(line)))
    text = "; ".join(reasons) or type(exc).__name__
    return text if len(text) <= _MAX_REASON else text[:_MAX_REASON - 1] + "…"


def _describe(ports: Sequence[ov.Output]) -> list[RuntimeTensor]:
    tensors = []
    for port in ports:
        type_name = port.get_element_type().get_type_name()
        datatype = _OV_TO_V2.get(type_name)
        if datatype is None:
            raise ConfigError(
                f"tensor {port.get_any_name()!r} has OpenVINO type {type_name}, which this server cannot serve"
            )
        shape = tuple(-1 if dim.is_dynamic else dim.get_length() for dim in port.get_partial_shape())
        tensors.append(RuntimeTensor(port.get_any_name(), datatype, shape))
    return tensors


def _device(context: LoadContext) -> str:
    """The config parameter ``device`` (CPU, GPU, NPU, AUTO...), else the instance group's kind."""
    parameter = context.parameter("device")
    if parameter is not None:
        return parameter
    kinds = {group.kind for group in context.config.instance_group}
    gpu = 1  # ModelInstanceGroup.KIND_GPU (KIND_CPU is 2)
    return "GPU" if gpu in kinds else "CPU"


class OpenVinoBackend(Backend):
    def __init__(self, context: LoadContext) -> None:
        core = ov.Core()
        device = _device(context)
        if device.split(":")[0].split(".")[0] not in ("AUTO", "MULTI", "HETERO", "BATCH") and not any(
            available.startswith(device) for available in core.available_devices
        ):
            raise ConfigError(
                f"OpenVINO device {device!r} is not present on this box; available: {core.available_devices}"
            )
        # f32 unless the config asks otherwise: on CPUs with native bf16 OpenVINO would silently
        # compute in bf16, several digits away from every other backend.
        properties: dict[str, object] = {
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": context.parameter("inference_precision") or "f32",
        }
        if context.artefacts is not None:
            properties["CACHE_DIR"] = str(context.artefacts)  # compiled blobs, reused on the next start
        if context.threads and device == "CPU":
            properties["INFERENCE_NUM_THREADS"] = context.threads
        try:
            model = core.read_model(str(context.model_file))
            self._compiled = core.compile_model(model, device, properties)
        except RuntimeError as exc:
            raise ConfigError(f"OpenVINO cannot load {context.model_file} on {device}: {openvino_reason(exc)}") from exc
        self._inputs = _describe(self._compiled.inputs)
        self._outputs = _describe(self._compiled.outputs)
        self._request = self._compiled.create_infer_request()
        self.device = device

    def inputs(self) -> Sequence[RuntimeTensor]:
        return self._inputs

    def outputs(self) -> Sequence[RuntimeTensor]:
        return self._outputs

    def run(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        try:
            results = self._request.infer(dict(inputs))
        except (RuntimeError, TypeError, ValueError) as exc:
            message = str(exc)
            if "shape" in message.lower() or "type" in message.lower():
                raise InvalidInput(f"OpenVINO refused the input: {message}") from exc
            raise InferenceFailed(f"OpenVINO failed to execute the model: {message}") from exc
        by_name = {port.get_any_name(): value for port, value in results.items()}
        # The request owns its output buffers; copy them out before the next inference reuses them.
        return {name: np.array(by_name[name], copy=True) for name in outputs if name in by_name}
