"""The InferenceResponse of pb_utils (its own module: requests, BLS calls and the channel all make or read
responses, and none of them needs the others for it)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from appliance.backends.python.model_process.pb.errors import TritonError, TritonModelException
from appliance.backends.python.model_process.pb.tensor import Tensor

__all__ = ["InferenceResponse", "parameters_json", "text_argument"]


def parameters_json(parameters: Any) -> str:
    """Parameters as Triton keeps them: JSON text of a dict of str keys to bool, int or str values."""
    if parameters is None:
        return "{}"
    if isinstance(parameters, str):  # already JSON (the server's own requests)
        json.loads(parameters)
        return parameters
    if not isinstance(parameters, dict):
        raise TritonModelException(f"parameters must be a dict, found type {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, (str, int, bool)):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}")
    return json.dumps(parameters)


def text_argument(value: Any, what: str) -> str:
    """A string argument as Triton's bindings take it: str, or bytes holding UTF-8 (a BYTES element)."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, str):
        return str(value)
    raise TritonModelException(f"{what} must be a string, not {type(value).__name__}")


class InferenceResponse:
    def __init__(self, output_tensors: Iterable[Tensor] | None = None, error: TritonError | str | None = None,
                 parameters: dict | str | None = None) -> None:
        self._outputs = list(output_tensors or [])
        for tensor in self._outputs:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(
                    f"output_tensors must hold pb_utils.Tensor objects, not {type(tensor).__name__}")
        self._error = TritonError(error) if isinstance(error, str) else error
        self._parameters = parameters_json(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        """JSON text, as in Triton."""
        return self._parameters
