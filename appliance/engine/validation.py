"""Check a request against a model's signature before it is queued, so one bad request never joins
(and fails) a batch with good ones.

The messages are Triton's (infer_request.cc), ``[request id: ...]`` prefix included: clients and
Triton's own tests look for those words. Where Triton's words do not say how to fix it, what to
change follows them.
"""

from __future__ import annotations

from typing import NoReturn

from appliance.core.errors import InvalidInput
from appliance.engine.signature import ModelSignature, TensorSpec
from appliance.engine.types import InferRequest

__all__ = ["request_prefix", "validate_request"]

_BATCH_NOTE = (
    ". NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended "
    "to each input shape. If you want to specify the full shape including the batch dim in your input dims "
    "config, try setting max_batch_size to zero. See the model configuration docs for more info on "
    "max_batch_size."
)


def request_prefix(request_id: str | None) -> str:
    """Triton's prefix of a request's errors: ``[request id: <id>] `` (``<id_unknown>`` without one)."""
    return f"[request id: {request_id or '<id_unknown>'}] "


def _shape_text(dims: tuple[int, ...] | list[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _names(names: list[str], none: str = "[]") -> str:
    # Triton joins them as ['a','b']; for no missing input it prints only the closing bracket.
    return "[" + ",".join(f"'{name}'" for name in sorted(names)) + "]" if names else none


def validate_request(model: str, signature: ModelSignature, request: InferRequest) -> int:
    """Raise InvalidInput with what was expected; return the request's batch size (1 if unbatched)."""
    # (Every message starts with Triton's prefix, built only for a refusal.)
    given = [tensor.name for tensor in request.inputs]
    specs = signature.inputs
    if len(given) == len(specs) and given == list(specs):  # the common request: every input, in order
        return _batch_size(model, signature, request)
    prefix = request_prefix(request.id)
    if len(set(given)) < len(given):  # Triton refuses a second input of a name as it is added
        twice = next(name for index, name in enumerate(given) if name in given[:index])
        raise InvalidInput(f"{prefix}input '{twice}' already exists in request")
    required = [name for name, spec in signature.inputs.items() if not spec.optional]
    if len(given) > len(signature.inputs) or len(set(given) & set(required)) < len(required):
        missing = [name for name in required if name not in given]
        # Triton's words: an exact count for a model without optional inputs, a range for one with them.
        expected = (f"{len(signature.inputs)} inputs" if len(required) == len(signature.inputs)
                    else f"number of inputs between {len(required)} and {len(signature.inputs)}")
        raise InvalidInput(
            f"{prefix}expected {expected} but got {len(given)} inputs for model '{model}'. "
            f"Got input(s) {_names(given)}, but missing required input(s) {_names(missing, ']')}. Please provide all "
            "required input(s)."
        )
    return _batch_size(model, signature, request)


def _refuse_batch(model: str, signature: ModelSignature, request: InferRequest, name: str, spec: TensorSpec,
                  shape: tuple[int, ...], batch: int | None) -> NoReturn:
    """InvalidInput for an input of a batching model whose batch dimension is wrong, in Triton's words."""
    if len(shape) >= 1 and shape[0] > signature.max_batch_size:
        raise InvalidInput(
            f"{request_prefix(request.id)}inference request batch-size must be <= "
            f"{signature.max_batch_size} for '{model}'"
        )
    if len(shape) < 1 or shape[0] < 1:
        raise InvalidInput(
            f"{request_prefix(request.id)}unexpected shape for input '{name}' for model '{model}'. "
            f"Expected {_shape_text(signature.full_shape(spec))}, got {_shape_text(shape)}{_BATCH_NOTE}"
        )
    raise InvalidInput(
        f"{request_prefix(request.id)}inputs of model '{model}' disagree on the batch size: {batch} and "
        f"{shape[0]} (input '{name}')"
    )


def _batch_size(model: str, signature: ModelSignature, request: InferRequest) -> int:
    """The rest of ``validate_request``, for inputs the model has (none twice, none required missing)."""
    batch: int | None = None
    batched = signature.max_batch_size > 0
    for tensor in request.inputs:
        spec = signature.inputs.get(tensor.name)
        if spec is None:
            raise InvalidInput(
                f"{request_prefix(request.id)}unexpected inference input '{tensor.name}' for model '{model}'; "
                f"the model's inputs are {sorted(signature.inputs)}"
            )
        if tensor.datatype != spec.datatype:
            raise InvalidInput(
                f"{request_prefix(request.id)}inference input '{tensor.name}' data-type is '{tensor.datatype}', "
                f"but model '{model}' expects '{spec.datatype}'"
            )
        shape = tensor.data.shape
        if batched:
            if not shape or not 0 < shape[0] <= signature.max_batch_size or (batch is not None and shape[0] != batch):
                _refuse_batch(model, signature, request, tensor.name, spec, shape, batch)
            batch = shape[0]
            shape = shape[1:]
        if shape != spec.dims and not spec.shape_matches(shape):
            note = _BATCH_NOTE if batched else ""
            raise InvalidInput(
                f"{request_prefix(request.id)}unexpected shape for input '{tensor.name}' for model '{model}'. "
                f"Expected {_shape_text(signature.full_shape(spec))}, got {_shape_text(tensor.data.shape)}{note}"
            )
    if not request.outputs:
        return batch or 1
    if len(request.outputs) > 1:
        named = [output.name for output in request.outputs]
        if len(set(named)) < len(named):  # Triton's words (2.51 returned it once; its later releases refuse it)
            twice = next(name for index, name in enumerate(named) if name in named[:index])
            raise InvalidInput(f"output '{twice}' already exists in request")
    for output in request.outputs:
        if output.name not in signature.outputs:
            raise InvalidInput(
                f"unexpected inference output '{output.name}' for model '{model}'; "
                f"the model's outputs are {sorted(signature.outputs)}"
            )
        if output.parameters and output.classification < 0:
            raise InvalidInput("invalid value for 'classification' parameter, expected >= 0")
    return batch or 1
