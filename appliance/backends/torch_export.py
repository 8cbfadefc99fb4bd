"""torch.export programs (model.pt2, an ExportedProgram saved with torch.export.save).

Beyond Triton: an ExportedProgram describes its tensors, dynamic dimensions included, so its config is
auto-completed like an ONNX model's. Inputs are named after forward()'s arguments, outputs OUTPUT__<i>.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from appliance.backends.base import Backend, LoadContext
from appliance.backends.torch_common import TORCH_TO_V2, outputs_by_name, prepare_torch, to_torch
from appliance.core.errors import ConfigError, InferenceFailed, InvalidInput
from appliance.core.tensors import RuntimeTensor

__all__ = ["TorchExportBackend"]


def _tensor(name: str, value: Any) -> RuntimeTensor:
    dtype = getattr(value, "dtype", None)
    datatype = TORCH_TO_V2.get(dtype) if isinstance(dtype, torch.dtype) else None
    if datatype is None:
        raise ConfigError(f"tensor {name!r} of the exported program is not a tensor this server can serve")
    return RuntimeTensor(name, datatype, tuple(d if isinstance(d, int) else -1 for d in value.shape))


class TorchExportBackend(Backend):
    def __init__(self, context: LoadContext) -> None:
        self._device = prepare_torch(context)
        try:
            program = torch.export.load(str(context.model_file))
        except Exception as exc:  # torch raises several types for a bad archive
            raise ConfigError(f"torch.export cannot load {context.model_file}: {exc}") from exc
        signature = program.graph_signature
        placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
        self._argument_names = list(signature.user_inputs)
        self._inputs = [_tensor(name, placeholders[name].meta.get("val")) for name in self._argument_names]
        output_node = next(n for n in program.graph.nodes if n.op == "output")
        values = output_node.args[0] if isinstance(output_node.args[0], (tuple, list)) else [output_node.args[0]]
        self._outputs = [_tensor(f"OUTPUT__{i}", v.meta.get("val")) for i, v in enumerate(values)]
        self._module = program.module().to(self._device)

    def inputs(self) -> Sequence[RuntimeTensor]:
        return self._inputs

    def outputs(self) -> Sequence[RuntimeTensor]:
        return self._outputs

    def run(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        arguments = [to_torch(inputs[name], self._device) for name in self._argument_names]
        try:
            with torch.inference_mode():
                result = self._module(*arguments)
        except (RuntimeError, AssertionError, ValueError) as exc:
            message = str(exc)
            if "shape" in message.lower() or "size" in message.lower() or "guard" in message.lower():
                raise InvalidInput(f"the exported program refused the input: {message}") from exc
            raise InferenceFailed(f"the exported program failed: {message}") from exc
        mapped = outputs_by_name(result, [t.name for t in self._outputs])
        return {name: mapped[name] for name in outputs if name in mapped}
