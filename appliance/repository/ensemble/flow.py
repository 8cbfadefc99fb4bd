"""How a request flows through an ensemble whose steps may be decoupled (Triton's decoupled ensembles).

A decoupled composing model answers a request with any number of responses; each of its responses
runs the steps after it once (Triton: "each response of a decoupled step flows on through the
downstream steps"). The tensors a request carries are therefore grouped in *frames*: the request's own
(its inputs and what the steps that answer once make of them), and one frame per response of a
decoupled step (that response's outputs and what the steps after it make of them). Triton refuses at
load a step that would mix tensors of different frames ("receives inputs originated from different
decoupled models"), and so does ``flow_of``; the steps of an ensemble then form a chain of levels: the
steps run in the request's frame, ending at most at one decoupled step, whose responses each open a
frame of the next level, and so on; the ensemble's outputs all come from the last level, whose every
frame answers the client once.

An ensemble is decoupled when any of its steps is (Triton sets the ensemble's
``model_transaction_policy`` so, whatever its config says).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from appliance.core.errors import ConfigError
from appliance.repository.ensemble.plan import EnsemblePlan, Step

__all__ = ["REQUEST_FRAME", "EnsembleFlow", "Level", "flow_of"]

REQUEST_FRAME = 0
"""The frame of the request itself; any other frame is named by the number of the decoupled step whose
responses open it."""


@dataclasses.dataclass(frozen=True, slots=True)
class Level:
    """The steps one frame runs, and where its frame goes next."""

    steps: tuple[Step, ...]
    """The steps that answer once, in dependency order (run as soon as their inputs exist)."""
    fan_out: Step | None
    """The decoupled step run last in this frame: each of its responses opens a frame of the next level.
    None in the last level, whose frames each answer the client once."""


@dataclasses.dataclass(frozen=True, eq=False)
class EnsembleFlow:
    plan: EnsemblePlan
    decoupled: frozenset[int]
    """The numbers of the decoupled steps."""
    frame_of: Mapping[int, int]
    """Step number -> the frame it runs in (``REQUEST_FRAME``, or the number of a decoupled step)."""
    _routes: dict[frozenset[str], tuple[tuple[Level, ...], frozenset[str]]] = dataclasses.field(
        default_factory=dict, repr=False)

    @property
    def is_decoupled(self) -> bool:
        return bool(self.decoupled)

    def route(self, outputs: frozenset[str]) -> tuple[tuple[Level, ...], frozenset[str]]:
        """The levels that produce ``outputs`` (only the steps leading to them) and the tensors involved."""
        known = self._routes.get(outputs)
        if known is None:
            known = self._routes[outputs] = self._levels(outputs)
        return known

    def _levels(self, outputs: frozenset[str]) -> tuple[tuple[Level, ...], frozenset[str]]:
        steps, needed = self.plan.needed(outputs)
        levels: list[Level] = []
        frame = REQUEST_FRAME
        while True:
            here = [step for step in steps if self.frame_of[step.number] == frame]
            fan_outs = [step for step in here if step.number in self.decoupled]
            # flow_of guarantees at most one: the outputs all come from one frame, and a frame's tensors
            # reach deeper frames only through the decoupled step that opens them.
            assert len(fan_outs) <= 1, fan_outs
            fan_out = fan_outs[0] if fan_outs else None
            levels.append(Level(tuple(s for s in here if s is not fan_out), fan_out))
            if fan_out is None:
                return tuple(levels), needed
            frame = fan_out.number


def _origin(frame: int, plan: EnsemblePlan) -> str:
    if frame == REQUEST_FRAME:
        return "the request"
    step = next(s for s in plan.steps if s.number == frame)
    return f"the responses of decoupled {step.label}"


def _mixed(plan: EnsemblePlan, who: str, reader: str, frames: Mapping[str, int]) -> ConfigError:
    by_frame: dict[int, list[str]] = {}
    for tensor, frame in sorted(frames.items()):
        by_frame.setdefault(frame, []).append(tensor)
    parts = "; ".join(f"{sorted(tensors)} from {_origin(frame, plan)}" for frame, tensors in sorted(by_frame.items()))
    return ConfigError(
        f"in ensemble {plan.name}, step of model '{who}' receives inputs originated from different decoupled "
        f"models ({reader} reads {parts}); each response of a decoupled model runs the steps after it once, so "
        "a step (and the ensemble's outputs) may combine tensors of one decoupled model's responses only: "
        "feed them from one decoupled step, or pass what they need through it"
    )


def flow_of(plan: EnsemblePlan, decoupled: frozenset[int]) -> EnsembleFlow:
    """The flow of ``plan`` when the steps numbered in ``decoupled`` are decoupled; ConfigError (Triton's
    words first, then the fix) when a step or the ensemble's outputs would mix frames."""
    frame_of_tensor = dict.fromkeys(plan.inputs, REQUEST_FRAME)
    frame_of: dict[int, int] = {}
    for step in plan.steps:  # in dependency order: every tensor a step reads has its frame already
        reads = {tensor: frame_of_tensor[tensor] for tensor in step.inputs.values()}
        frames = set(reads.values())
        if len(frames) > 1:
            raise _mixed(plan, step.model, step.label, reads)
        frame = frame_of[step.number] = frames.pop()
        made = step.number if step.number in decoupled else frame
        for tensor in step.outputs.values():
            frame_of_tensor[tensor] = made
    outputs = {tensor: frame_of_tensor[tensor] for tensor in plan.outputs}
    if len(set(outputs.values())) > 1:
        raise _mixed(plan, plan.name, "the ensemble's output", outputs)
    return EnsembleFlow(plan, decoupled, frame_of)
