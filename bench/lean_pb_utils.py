"""The least of Triton's ``triton_python_backend_utils`` a Python-backend model needs to run in the lean
reference's model process (bench.lean_model): tensors, a request's inputs, a response or its error. Enough
for models that answer each request from its inputs (bench/triton_models.py's identity); nothing that
calls other models, streams or keeps sequences.

It repeats, on purpose, the shape of the appliance's own pb_utils
(appliance.backends.python.model_process.pb): the lean reference is the measure of what a server without
the appliance costs, so it imports nothing of the appliance (nor its checks on each response's tensors
and parameters)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["InferenceRequest", "InferenceResponse", "Tensor", "TritonError", "TritonModelException",
           "get_input_tensor_by_name", "get_output_tensor_by_name"]


class TritonModelException(Exception):
    pass


class TritonError:
    def __init__(self, message: str) -> None:
        self._message = message

    def message(self) -> str:
        return self._message


class Tensor:
    __slots__ = ("_name", "_array")

    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name = name
        self._array = np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class InferenceRequest:
    """A request as the model's ``execute`` sees it: its input tensors."""

    __slots__ = ("_inputs",)

    def __init__(self, inputs: Sequence[Tensor]) -> None:
        self._inputs = list(inputs)

    def inputs(self) -> list[Tensor]:
        return self._inputs


class InferenceResponse:
    __slots__ = ("_outputs", "_error")

    def __init__(self, output_tensors: Sequence[Tensor] = (), error: TritonError | None = None) -> None:
        self._outputs = list(output_tensors)
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


def _by_name(tensors: Sequence[Tensor], name: str) -> Tensor | None:
    return next((tensor for tensor in tensors if tensor.name() == name), None)


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return _by_name(request.inputs(), name)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return _by_name(response.output_tensors(), name)
