"""TorchScript models (model.pt) with torch.jit.load, on CPU or CUDA (Triton's pytorch_libtorch)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from appliance.backends.base import Backend, LoadContext
from appliance.backends.torch_common import argument_index, outputs_by_name, prepare_torch, to_torch
from appliance.core.errors import ConfigError, InferenceFailed, InvalidInput

__all__ = ["TorchScriptBackend"]


def _config_example(name: str, arguments: Sequence[str]) -> str:
    inputs = ",\n".join(
        f'  {{ name: "INPUT__{i}" data_type: TYPE_FP32 dims: [ ... ] }}  # forward argument {arg!r}'
        for i, arg in enumerate(arguments)
    ) or '  { name: "INPUT__0" data_type: TYPE_FP32 dims: [ ... ] }'
    return (
        f"a TorchScript file does not describe its tensors, so model {name!r} needs a config.pbtxt "
        f"such as:\nmax_batch_size: 8\ninput [\n{inputs}\n]\n"
        'output [\n  { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ ... ] }\n]'
    )


class TorchScriptBackend(Backend):
    def __init__(self, context: LoadContext) -> None:
        self._device = prepare_torch(context)
        try:
            self._module = torch.jit.load(str(context.model_file), map_location=self._device).eval()
        except (RuntimeError, ValueError) as exc:
            raise ConfigError(f"torch cannot load {context.model_file} as TorchScript: {exc}") from exc
        try:
            arguments = [a.name for a in self._module.forward.schema.arguments][1:]  # drop self
        except AttributeError:
            arguments = []
        config = context.config
        if not config.input or not config.output:
            raise ConfigError(_config_example(context.model_name, arguments))
        # The sequence batcher's control and state tensors are inputs and outputs too, though not listed.
        batching = config.sequence_batching
        fed = [c.name for c in batching.control_input] + [s.input_name for s in batching.state]
        self._positions = {name: argument_index(name, arguments) for name in [e.name for e in config.input] + fed}
        declared = [entry.name for entry in config.output]
        self._output_names = declared + [s.output_name for s in batching.state if s.output_name not in declared]

    def inputs(self) -> None:
        return None  # TorchScript does not say: the config declares the tensors

    def outputs(self) -> None:
        return None

    def run(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        arguments: list[torch.Tensor | None] = [None] * (max(self._positions.values(), default=-1) + 1)
        for name, array in inputs.items():
            arguments[self._positions[name]] = to_torch(array, self._device)
        try:
            with torch.inference_mode():
                result = self._module(*arguments)
        except RuntimeError as exc:
            message = str(exc)
            if "size" in message or "shape" in message or "dtype" in message:
                raise InvalidInput(f"the TorchScript model refused the input: {message}") from exc
            raise InferenceFailed(f"the TorchScript model failed: {message}") from exc
        mapped = outputs_by_name(result, self._output_names)
        return {name: mapped[name] for name in outputs if name in mapped}
