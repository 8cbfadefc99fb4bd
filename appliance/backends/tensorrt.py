"""Serialized TensorRT engines (model.plan) on a CUDA GPU.

Buffers are torch CUDA tensors (torch is in the nvidia flavour already), so no second CUDA binding is
needed. One execution context and one CUDA stream per instance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import tensorrt as trt
import torch

from appliance.backends.base import Backend, LoadContext
from appliance.core.errors import BackendUnavailable, ConfigError, InferenceFailed, InvalidInput
from appliance.core.tensors import RuntimeTensor

__all__ = ["TensorRTBackend"]

_TRT_TYPES: dict[object, tuple[str, torch.dtype]] = {
    trt.float32: ("FP32", torch.float32),
    trt.float16: ("FP16", torch.float16),
    trt.int8: ("INT8", torch.int8),
    trt.int32: ("INT32", torch.int32),
    trt.bool: ("BOOL", torch.bool),
    trt.uint8: ("UINT8", torch.uint8),
}
if hasattr(trt, "int64"):
    _TRT_TYPES[trt.int64] = ("INT64", torch.int64)
if hasattr(trt, "bfloat16"):
    _TRT_TYPES[trt.bfloat16] = ("BF16", torch.bfloat16)

_LOGGER = trt.Logger(trt.Logger.WARNING)


def _gpu_index(context: LoadContext) -> int:
    for group in context.config.instance_group:
        if group.gpus:
            return int(group.gpus[context.instance_index % len(group.gpus)])
    return 0


class TensorRTBackend(Backend):
    def __init__(self, context: LoadContext) -> None:
        if not torch.cuda.is_available():
            raise BackendUnavailable("TensorRT needs a CUDA GPU, and torch sees none on this box")
        self._device = torch.device("cuda", _gpu_index(context))
        with torch.cuda.device(self._device):
            runtime = trt.Runtime(_LOGGER)
            self._engine = runtime.deserialize_cuda_engine(context.model_file.read_bytes())
            if self._engine is None:
                raise ConfigError(
                    f"TensorRT cannot deserialize {context.model_file}; engines are tied to the TensorRT "
                    "version and GPU they were built with: rebuild it on this box"
                )
            self._context = self._engine.create_execution_context()
            self._stream = torch.cuda.Stream(self._device)
        self._inputs: list[RuntimeTensor] = []
        self._outputs: list[RuntimeTensor] = []
        self._torch_types: dict[str, torch.dtype] = {}
        for index in range(self._engine.num_io_tensors):
            name = self._engine.get_tensor_name(index)
            kind = self._engine.get_tensor_dtype(name)
            if kind not in _TRT_TYPES:
                raise ConfigError(f"TensorRT tensor {name!r} has type {kind}, which this server cannot serve")
            datatype, torch_type = _TRT_TYPES[kind]
            self._torch_types[name] = torch_type
            tensor = RuntimeTensor(name, datatype, tuple(int(d) for d in self._engine.get_tensor_shape(name)))
            is_input = self._engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            (self._inputs if is_input else self._outputs).append(tensor)

    def inputs(self) -> Sequence[RuntimeTensor]:
        return self._inputs

    def outputs(self) -> Sequence[RuntimeTensor]:
        return self._outputs

    def run(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        keep: list[torch.Tensor] = []  # device buffers must outlive the asynchronous execution
        with torch.cuda.device(self._device), torch.cuda.stream(self._stream):
            for name, array in inputs.items():
                staged = torch.from_numpy(array if array.flags.writeable else array.copy())
                device = staged.to(self._device, non_blocking=True)
                keep.append(device)
                if not self._context.set_input_shape(name, tuple(array.shape)):
                    raise InvalidInput(f"TensorRT refused shape {list(array.shape)} for input '{name}'")
                self._context.set_tensor_address(name, device.data_ptr())
            results: dict[str, torch.Tensor] = {}
            for tensor in self._outputs:  # TensorRT needs every output bound, requested or not
                shape = tuple(self._context.get_tensor_shape(tensor.name))
                if any(d < 0 for d in shape):
                    raise InferenceFailed(f"TensorRT could not resolve the shape of output '{tensor.name}'")
                buffer = torch.empty(shape, dtype=self._torch_types[tensor.name], device=self._device)
                self._context.set_tensor_address(tensor.name, buffer.data_ptr())
                results[tensor.name] = buffer
            if not self._context.execute_async_v3(self._stream.cuda_stream):
                raise InferenceFailed("TensorRT failed to execute the engine")
            host = {name: results[name].to("cpu", non_blocking=True) for name in outputs if name in results}
            self._stream.synchronize()
        return {name: value.numpy() for name, value in host.items()}

    def close(self) -> None:
        del self._context
        del self._engine
