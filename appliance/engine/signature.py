"""What a model takes and returns, in the form the request path checks against."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tritonclient.grpc import model_config_pb2 as mc

__all__ = ["ModelSignature", "TensorSpec", "input_reshapes"]


@dataclasses.dataclass(frozen=True, slots=True)
class TensorSpec:
    """A tensor as the model config declares it: ``dims`` exclude the batch dimension."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False
    label_filename: str = ""

    def shape_matches(self, shape: tuple[int, ...]) -> bool:
        return len(shape) == len(self.dims) and all(
            want == -1 or want == got for want, got in zip(self.dims, shape)
        )


@dataclasses.dataclass(frozen=True, slots=True)
class ModelSignature:
    max_batch_size: int
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0

    def full_shape(self, spec: TensorSpec) -> list[int]:
        """The shape a client sees in model metadata (Triton puts -1 first when batching)."""
        return [-1, *spec.dims] if self.batched else list(spec.dims)


def input_reshapes(config: mc.ModelConfig) -> dict[str, tuple[int, ...]]:
    """Inputs with a config ``reshape``: clients send ``dims``, the runtime sees these shapes (led by -1,
    the batch dimension, when the model batches)."""
    batch = (-1,) if config.max_batch_size > 0 else ()
    return {entry.name: (*batch, *entry.reshape.shape) for entry in config.input if entry.HasField("reshape")}
