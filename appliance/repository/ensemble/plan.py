"""An ensemble's steps and the tensors between them, checked from its config alone.

What can be told without the composing models is checked here (steps named and mapped, each tensor
written once, every ensemble input read, every output written, no step waiting on itself); what needs
them (their tensors, batching, decoupling) is in ``appliance.repository.ensemble.compose``. Wording follows
Triton's where it has one, followed by the fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from tritonclient.grpc import model_config_pb2 as mc

from appliance.core.errors import ConfigError
from appliance.repository.config import ENSEMBLE_PLATFORM, is_ensemble

__all__ = ["ENSEMBLE_PLATFORM", "EnsemblePlan", "Step", "is_ensemble", "plan_ensemble"]


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    number: int
    """1-based, as Triton numbers steps in its messages."""
    model: str
    version: int | None
    """None: the newest ready version (Triton's model_version -1)."""
    inputs: dict[str, str]
    """Composing model input -> ensemble tensor."""
    outputs: dict[str, str]
    """Composing model output -> ensemble tensor."""

    @property
    def label(self) -> str:
        return f"step {self.number} (model '{self.model}')"


@dataclasses.dataclass(frozen=True, eq=False)
class EnsemblePlan:
    name: str
    steps: tuple[Step, ...]
    """In dependency order: a step comes after every step it reads from."""
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    writer: dict[str, Step]
    """Ensemble tensor -> the step that writes it (ensemble inputs have none)."""
    _needed: dict[frozenset[str], tuple[tuple[Step, ...], frozenset[str]]] = dataclasses.field(
        default_factory=dict, repr=False)

    def models(self) -> set[str]:
        return {step.model for step in self.steps}

    def needed(self, outputs: frozenset[str]) -> tuple[tuple[Step, ...], frozenset[str]]:
        """The steps (in dependency order) and tensors that produce ``outputs``: a request that asks for
        fewer outputs runs only the branches leading to them."""
        known = self._needed.get(outputs)
        if known is None:
            known = self._needed[outputs] = self._trace_back(outputs)
        return known

    def _trace_back(self, outputs: frozenset[str]) -> tuple[tuple[Step, ...], frozenset[str]]:
        tensors: set[str] = set()
        wanted = list(outputs)
        steps: set[int] = set()
        while wanted:
            tensor = wanted.pop()
            if tensor in tensors:
                continue
            tensors.add(tensor)
            step = self.writer.get(tensor)
            if step is not None and step.number not in steps:
                steps.add(step.number)
                wanted.extend(step.inputs.values())
        return tuple(s for s in self.steps if s.number in steps), frozenset(tensors)


def _refuse_model_settings(config: mc.ModelConfig, name: str) -> None:
    if config.backend:
        raise ConfigError(f"Ensemble model '{name}' must have platform type 'ensemble' and empty backend type; "
                          f"remove backend: {config.backend!r}")
    if not config.HasField("ensemble_scheduling"):
        raise ConfigError(f"ensemble scheduling must be set for ensemble {name} whose platform is ensemble; add "
                          "ensemble_scheduling { step [ { model_name: ... input_map {...} output_map {...} } ] }")
    if config.platform != ENSEMBLE_PLATFORM:
        raise ConfigError(f"model '{name}' has ensemble_scheduling but platform {config.platform!r}; "
                          'set platform: "ensemble"')
    if config.instance_group:
        raise ConfigError(f"instance group should not be specified for ensemble '{name}'; an ensemble runs no "
                          "instances of its own: scale its composing models with their instance_group")
    if config.HasField("optimization"):
        raise ConfigError(f"optimization should not be specified for ensemble '{name}'; set it on the composing "
                          "models")
    if config.model_warmup:
        raise ConfigError(f"model_warmup can not be specified for ensemble '{name}'; warm up its composing models")
    for kind, entries in (("input", config.input), ("output", config.output)):
        for entry in entries:
            if entry.data_type == mc.TYPE_INVALID:
                raise ConfigError(f"ensemble '{name}' {kind} '{entry.name}' needs a data_type (an ensemble's "
                                  "inputs and outputs are not auto-completed)")


def _read_steps(config: mc.ModelConfig, name: str) -> list[Step]:
    if not config.ensemble_scheduling.step:
        raise ConfigError(f"must specify 'step' for ensemble '{name}'")
    steps = []
    for number, step in enumerate(config.ensemble_scheduling.step, start=1):
        for field in ("model_name", "input_map", "output_map"):
            if not getattr(step, field):
                raise ConfigError(f"must specify '{field}' in step {number} of ensemble '{name}'")
        version = None if step.model_version < 0 else step.model_version
        steps.append(Step(number, step.model_name, version, dict(step.input_map), dict(step.output_map)))
    return steps


def _writers(steps: list[Step], inputs: set[str], name: str) -> dict[str, Step]:
    writer: dict[str, Step] = {}
    for step in steps:
        for tensor in step.outputs.values():
            if tensor in inputs:
                raise ConfigError(f"in ensemble '{name}', {step.label} writes '{tensor}', which is an ensemble "
                                  "input; map the output to a tensor of its own")
            if tensor in writer:
                who = (f"{step.label} maps two of its outputs to it" if writer[tensor] is step
                       else f"{writer[tensor].label} and {step.label} both write it")
                raise ConfigError(f"ensemble tensor '{tensor}' can appear in an output map only once for ensemble "
                                  f"'{name}' ({who}); rename one of them")
            writer[tensor] = step
    return writer


def _check_tensors(steps: list[Step], inputs: set[str], outputs: set[str], writer: dict[str, Step],
                   name: str) -> None:
    read = {tensor for step in steps for tensor in step.inputs.values()}
    for step in steps:
        for model_input, tensor in step.inputs.items():
            if tensor not in inputs and tensor not in writer:
                raise ConfigError(
                    f"in ensemble '{name}', {step.label} reads ensemble tensor '{tensor}' (for its input "
                    f"'{model_input}'), which is neither an ensemble input nor written by any step; add it to "
                    "the ensemble's inputs or to a step's output_map"
                )
    for tensor in sorted(inputs - read):
        raise ConfigError(f"ensemble input '{tensor}' for ensemble '{name}' is not used; map it in a step's "
                          "input_map or remove it from the ensemble's inputs")
    for tensor in sorted(outputs - set(writer)):
        raise ConfigError(f"output '{tensor}' for ensemble '{name}' is not written; map a composing model's "
                          "output to it in a step's output_map")
    for tensor in sorted(set(writer) - read - outputs):
        raise ConfigError(f"ensemble tensor '{tensor}' is unused in ensemble '{name}' (written by "
                          f"{writer[tensor].label}, read by no step and not an ensemble output); drop it from "
                          "the output_map or use it")


def _order(steps: list[Step], writer: dict[str, Step], name: str) -> tuple[Step, ...]:
    """The steps in dependency order (Kahn's algorithm); a cycle fails with the steps on it."""
    after: dict[int, set[int]] = {s.number: {writer[t].number for t in s.inputs.values() if t in writer}
                                  for s in steps}
    by_number = {s.number: s for s in steps}
    ordered: list[Step] = []
    done: set[int] = set()
    while len(ordered) < len(steps):
        ready = [n for n, deps in after.items() if n not in done and deps <= done]
        if not ready:
            cycle = _cycle(after, [n for n in after if n not in done])
            if len(cycle) == 2:  # a step reading its own output
                raise ConfigError(f"in ensemble '{name}', {by_number[cycle[0]].label} reads a tensor it writes "
                                  "itself; the tensors between steps must flow one way")
            path = " -> ".join(by_number[n].label for n in cycle)
            raise ConfigError(f"in ensemble '{name}', steps wait on each other's outputs in a cycle: {path}; "
                              "the tensors between steps must flow one way")
        for number in sorted(ready):
            done.add(number)
            ordered.append(by_number[number])
    return tuple(ordered)


def _cycle(after: dict[int, set[int]], left: Iterable[int]) -> list[int]:
    """One cycle among the steps ``left`` (each of which waits on another of them)."""
    left = set(left)
    node = min(left)
    seen: list[int] = []
    while node not in seen:
        seen.append(node)
        node = min(after[node] & left)
    return [*seen[seen.index(node):], node]


def plan_ensemble(config: mc.ModelConfig) -> EnsemblePlan:
    """The checked plan of an ensemble config, or ConfigError naming the step and tensor at fault."""
    name = config.name
    _refuse_model_settings(config, name)
    steps = _read_steps(config, name)
    inputs = {entry.name for entry in config.input}
    outputs = {entry.name for entry in config.output}
    writer = _writers(steps, inputs, name)
    _check_tensors(steps, inputs, outputs, writer, name)
    ordered = _order(steps, writer, name)
    return EnsemblePlan(name, ordered, tuple(e.name for e in config.input), tuple(e.name for e in config.output),
                        writer)
