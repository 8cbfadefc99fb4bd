"""An ensemble's plan checked against its composing models' configs: each mapped tensor exists, every
required input is fed, batching fits, every ensemble tensor has one data type and a shape all its
readers and writers agree on (-1 matches any size), and the responses of decoupled steps flow as Triton
lets them (see ``appliance.repository.ensemble.flow``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tritonclient.grpc import model_config_pb2 as mc

from appliance.core.errors import ConfigError
from appliance.repository.ensemble.flow import EnsembleFlow, flow_of
from appliance.repository.ensemble.plan import EnsemblePlan, Step

__all__ = ["check_composition"]


@dataclasses.dataclass(frozen=True, slots=True)
class _Use:
    """One place an ensemble tensor is declared: its type and full shape (batch dimension included)."""

    datatype: int
    shape: tuple[int, ...]
    source: str


def _full_shape(entry: mc.ModelInput | mc.ModelOutput, batched: bool) -> tuple[int, ...]:
    return (-1, *entry.dims) if batched else tuple(entry.dims)


def _shapes_agree(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))


def _shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _check_step(plan: EnsemblePlan, ensemble: mc.ModelConfig, step: Step, config: mc.ModelConfig,
                uses: dict[str, list[_Use]]) -> None:
    name = plan.name
    if ensemble.response_cache.enable and config.HasField("sequence_batching"):
        # Triton: an ensemble caches only if every composing model could (a sequence step answers from its state).
        raise ConfigError(f"Response Cache does not currently support model {name}: its {step.label} uses the "
                          "sequence batching scheduler, whose answers depend on the sequence's state. Please "
                          "disable the ensemble's response cache.")
    if ensemble.max_batch_size > config.max_batch_size:
        raise ConfigError(
            f"ensemble {name} allows maximum batch size {ensemble.max_batch_size}, but it contains model "
            f"{step.model} which only allows maximum batch size to be {config.max_batch_size}; lower the "
            "ensemble's max_batch_size (0 when a composing model does not batch)"
        )
    batched = config.max_batch_size > 0
    model_inputs = {entry.name: entry for entry in config.input}
    _record_uses(name, step, "input", step.inputs, model_inputs, batched, uses)
    for key, entry in model_inputs.items():
        if key not in step.inputs and not entry.optional:
            raise ConfigError(f"in ensemble {name}, input {key} in model {step.model} is not mapped to any "
                              f"ensemble tensors; add it to the input_map of step {step.number}")
    _record_uses(name, step, "output", step.outputs, {entry.name: entry for entry in config.output}, batched, uses)


def _record_uses(name: str, step: Step, side: str, mapping: dict[str, str],
                 entries: dict[str, mc.ModelInput] | dict[str, mc.ModelOutput], batched: bool,
                 uses: dict[str, list[_Use]]) -> None:
    """Each ensemble tensor ``mapping`` maps to or from the step model's ``side`` (input or output), with
    the type and shape that model has there; ConfigError for a name the model does not have."""
    verb = "is mapping to" if side == "input" else "is mapped from"
    for key, tensor in mapping.items():
        entry = entries.get(key)
        if entry is None:
            raise ConfigError(f"in ensemble {name}, ensemble tensor {tensor} {verb} non-existing {side} {key} "
                              f"in model {step.model} ({step.label}); its {side}s are {sorted(entries)}")
        uses.setdefault(tensor, []).append(_Use(entry.data_type, _full_shape(entry, batched),
                                                f"{side} '{key}' of {step.label}"))


def _check_agreement(name: str, tensor: str, uses: list[_Use]) -> None:
    first = uses[0]
    for other in uses[1:]:
        if other.datatype != first.datatype:
            raise ConfigError(
                f"in ensemble {name}, ensemble tensor {tensor}: inconsistent data type: "
                f"{mc.DataType.Name(first.datatype)} is inferred from {first.source} while "
                f"{mc.DataType.Name(other.datatype)} is inferred from {other.source}; make both declare one type"
            )
        if not _shapes_agree(first.shape, other.shape):
            raise ConfigError(
                f"in ensemble {name}, ensemble tensor {tensor}: inconsistent shape: {_shape_text(first.shape)} "
                f"is inferred from {first.source} while {_shape_text(other.shape)} is inferred from "
                f"{other.source} (shapes include the batch dimension, -1 when batched)"
            )


def check_composition(plan: EnsemblePlan, ensemble: mc.ModelConfig,
                      config_of: Callable[[Step], mc.ModelConfig]) -> EnsembleFlow:
    """How requests flow through the ensemble with these composing models (which steps are decoupled), or
    ConfigError naming the step and tensor at fault. ``config_of(step)``: the config of the version the
    step runs (raises ConfigError when that model or version is not loaded)."""
    decoupled = frozenset(step.number for step in plan.steps
                          if config_of(step).model_transaction_policy.decoupled)
    uses: dict[str, list[_Use]] = {}
    batched = ensemble.max_batch_size > 0
    for kind, entries in (("input", ensemble.input), ("output", ensemble.output)):
        for entry in entries:
            uses.setdefault(entry.name, []).append(
                _Use(entry.data_type, _full_shape(entry, batched), f"ensemble {kind} '{entry.name}'"))
    for step in plan.steps:
        _check_step(plan, ensemble, step, config_of(step), uses)
    for tensor, found in uses.items():
        _check_agreement(plan.name, tensor, found)
    return flow_of(plan, decoupled)
