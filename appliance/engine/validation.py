"""Check a request against a model's signature before it is queued, so one bad request never joins
(and fails) a batch with good ones."""

from __future__ import annotations

from appliance.engine.signature import ModelSignature
from appliance.engine.types import InferRequest
from appliance.errors import InvalidInput

__all__ = ["validate_request"]


def _shape_text(dims: tuple[int, ...] | list[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def validate_request(model: str, signature: ModelSignature, request: InferRequest) -> int:
    """Raise InvalidInput with what was expected; return the request's batch size (1 if unbatched)."""
    seen: set[str] = set()
    batch: int | None = None
    for tensor in request.inputs:
        spec = signature.inputs.get(tensor.name)
        if spec is None:
            raise InvalidInput(
                f"unexpected inference input '{tensor.name}' for model '{model}'; "
                f"the model's inputs are {sorted(signature.inputs)}"
            )
        if tensor.name in seen:
            raise InvalidInput(f"input '{tensor.name}' appears more than once in the request")
        seen.add(tensor.name)
        if tensor.datatype != spec.datatype:
            raise InvalidInput(
                f"inference input '{tensor.name}' data-type is '{tensor.datatype}', "
                f"but model '{model}' expects '{spec.datatype}'"
            )
        shape = tensor.data.shape
        if signature.batched:
            if len(shape) < 1 or not 1 <= shape[0] <= signature.max_batch_size:
                raise InvalidInput(
                    f"inference input '{tensor.name}' for model '{model}' has shape {_shape_text(shape)}; "
                    f"the first dimension is the batch size and must be 1..{signature.max_batch_size} "
                    f"(expected {_shape_text(signature.full_shape(spec))})"
                )
            if batch is not None and shape[0] != batch:
                raise InvalidInput(
                    f"inputs of model '{model}' disagree on the batch size: {batch} and "
                    f"{shape[0]} (input '{tensor.name}')"
                )
            batch = shape[0]
            shape = shape[1:]
        if not spec.shape_matches(shape):
            raise InvalidInput(
                f"unexpected shape for input '{tensor.name}' for model '{model}'. Expected "
                f"{_shape_text(signature.full_shape(spec))}, got {_shape_text(tensor.data.shape)}"
            )
    missing = sorted(name for name, spec in signature.inputs.items() if not spec.optional and name not in seen)
    if missing:
        raise InvalidInput(
            f"expected {len(signature.inputs)} inputs but got {len(request.inputs)} inputs for model "
            f"'{model}'; missing {missing}"
        )
    for output in request.outputs:
        if output.name not in signature.outputs:
            raise InvalidInput(
                f"unexpected inference output '{output.name}' for model '{model}'; "
                f"the model's outputs are {sorted(signature.outputs)}"
            )
        if output.classification < 0:
            raise InvalidInput(f"output '{output.name}': classification count must be >= 0")
    return batch or 1
