"""The parts of Triton's ``triton_python_backend_utils`` that model.py files use.

Imported by model.py files as ``import triton_python_backend_utils as pb_utils`` inside the model's
own process (the stub puts this module on the path under that name).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

__all__ = [
    "InferenceRequest",
    "InferenceResponse",
    "Logger",
    "ModelConfig",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "numpy_to_triton_type",
    "triton_string_to_numpy",
]

_TRITON_TO_NUMPY = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
    "TYPE_BYTES": np.object_,
}


def triton_string_to_numpy(triton_type_string: str) -> type:
    return _TRITON_TO_NUMPY[triton_type_string]


def numpy_to_triton_type(data_type: Any) -> str:
    data_type = np.dtype(data_type)
    if data_type.kind in "OSU":
        return "TYPE_STRING"
    for name, candidate in _TRITON_TO_NUMPY.items():
        if np.dtype(candidate) == data_type and name != "TYPE_BYTES":
            return name
    raise ValueError(f"no Triton type for numpy dtype {data_type}")


class TritonError(Exception):
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        super().__init__(message)
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class TritonModelException(Exception):
    pass


class Tensor:
    def __init__(self, name: str, data: Any) -> None:
        array = np.asarray(data)
        if array.dtype.kind in "SU":
            array = np.array([v.encode() if isinstance(v, str) else bytes(v) for v in array.ravel()],
                             dtype=object).reshape(array.shape)
        self._name = name
        self._array = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def triton_dtype(self) -> str:
        return numpy_to_triton_type(self._array.dtype)

    def to_dlpack(self) -> Any:
        return self._array.__dlpack__()

    @classmethod
    def from_dlpack(cls, name: str, capsule: Any) -> Tensor:
        return cls(name, np.from_dlpack(capsule))


class InferenceRequest:
    def __init__(self, inputs: list[Tensor], requested_output_names: list[str], request_id: str = "",
                 parameters: dict | str | None = None, model_name: str = "", model_version: int = -1,
                 **_: Any) -> None:
        self._inputs = inputs
        self._requested = list(requested_output_names)
        self._id = request_id
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(parameters or {})

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._requested

    def request_id(self) -> str:
        return self._id

    def parameters(self) -> str:
        """JSON text, as in Triton."""
        return self._parameters

    def is_cancelled(self) -> bool:
        return False


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None,
                 parameters: dict | None = None) -> None:
        self._outputs = list(output_tensors or [])
        self._error = error
        self._parameters = parameters or {}

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


def _config_entry(model_config: dict, kind: str, name: str) -> dict:
    return next((entry for entry in model_config.get(kind, []) if entry.get("name") == name), {})


def get_input_config_by_name(model_config: dict, name: str) -> dict:
    return _config_entry(model_config, "input", name)


def get_output_config_by_name(model_config: dict, name: str) -> dict:
    return _config_entry(model_config, "output", name)


class ModelConfig:
    """What ``auto_complete_config(auto_complete_model_config)`` receives and returns."""

    def __init__(self, model_config: dict) -> None:
        self._config = model_config

    def as_dict(self) -> dict:
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        self._config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        self._config.setdefault("dynamic_batching", {})

    def add_input(self, spec: dict) -> None:
        self._add("input", spec)

    def add_output(self, spec: dict) -> None:
        self._add("output", spec)

    def _add(self, kind: str, spec: dict) -> None:
        entries = self._config.setdefault(kind, [])
        if any(e.get("name") == spec["name"] for e in entries):
            raise ValueError(f"{kind} {spec['name']!r} is already in the config")
        entries.append(dict(spec))


class Logger:
    _log = logging.getLogger("model.py")

    @classmethod
    def log_info(cls, message: str) -> None:
        cls._log.info(message)

    @classmethod
    def log_warn(cls, message: str) -> None:
        cls._log.warning(message)

    @classmethod
    def log_error(cls, message: str) -> None:
        cls._log.error(message)

    @classmethod
    def log_verbose(cls, message: str) -> None:
        cls._log.debug(message)

    @classmethod
    def log(cls, message: str, level: int = logging.INFO) -> None:
        cls._log.log(level, message)

