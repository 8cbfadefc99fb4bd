"""Send the corpus to real Triton and to the appliance, case by case, and sort what came back."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from tests.oracle.corpus import Case
from tests.oracle.normalise import normalise
from tests.oracle.wire import Answer, Http, Target, send
from tests.waiting import wait_until

__all__ = ["OracleDied", "Outcome", "compare", "counts", "describe", "diff_paths"]


@dataclass
class Outcome:
    case: Case
    triton: Answer
    appliance: Answer

    @property
    def kind(self) -> str:
        """identical, status (the statuses differ) or body (same status, different body)."""
        if self.triton.status != self.appliance.status:
            return "status"
        if self.triton.as_dict() != self.appliance.as_dict():
            return "body"
        return "identical"


class OracleDied(RuntimeError):
    """Real Triton stopped answering (tritonserver 2.51 has crashed on a stream's end here)."""


def compare(cases: Sequence[Case], triton: Target, appliance: Target,
            triton_alive: Callable[[], bool] = lambda: True) -> list[Outcome]:
    """Each case to Triton, then to the appliance (its hooks around each), answers normalised.
    Raises OracleDied, naming the case, when Triton's process is gone."""
    channels: dict[str, grpc.Channel] = {}
    outcomes = []
    try:
        for case in cases:
            answers = []
            for target in (triton, appliance):
                if case.before is not None:
                    case.before()
                answer = send(case.request, target, channels)
                if case.after is not None:
                    answer.extra = case.after()
                if case.settle:
                    _settle(target, channels)
                if case.counted is not None:
                    _counted(target, channels, case.counted)
                answers.append(normalise(case.name, answer))
            if not triton_alive():
                raise OracleDied(f"tritonserver died at case {case.name}")
            outcomes.append(Outcome(case, *answers))
    finally:
        for channel in channels.values():
            channel.close()
    return outcomes


def _settle(target: Target, channels: dict[str, grpc.Channel], timeout: float = 20) -> None:
    def settled() -> bool:
        index = send(Http("POST", "/v2/repository/index", b"{}"), target, channels)
        rows = index.body if isinstance(index.body, list) else []
        return not any(isinstance(row, dict) and row.get("state") in ("LOADING", "UNLOADING") for row in rows)

    with contextlib.suppress(AssertionError):  # as settled as it gets: the comparison shows the rest
        wait_until(settled, timeout=timeout, interval=0.05)


_STILL_READS = 3
"""Reads of a model's statistics in a row, 50 ms apart, that must agree before they count as settled."""


def _counted(target: Target, channels: dict[str, grpc.Channel], model: str, timeout: float = 10) -> None:
    reads: list[object] = []

    def counted() -> bool:
        answer = send(Http("GET", f"/v2/models/{model}/stats"), target, channels)
        rows = answer.body.get("model_stats", []) if isinstance(answer.body, dict) else []
        reads.append(answer.body)
        still = len(reads) >= _STILL_READS and all(read == reads[-1] for read in reads[-_STILL_READS:])
        return still and any(row.get("execution_count") for row in rows)

    with contextlib.suppress(AssertionError):  # not counted in time: the comparison shows it
        wait_until(counted, timeout=timeout, interval=0.05)


def counts(outcomes: Sequence[Outcome]) -> dict[str, int]:
    found = Counter(outcome.kind for outcome in outcomes)
    return {kind: found.get(kind, 0) for kind in ("identical", "status", "body")}


def describe(outcome: Outcome, width: int = 300) -> str:
    """The case, then each place the two answers differ: ``path: triton's != the appliance's``."""
    lines = [f"{outcome.case.name} [{outcome.kind}]"]
    lines += [f"    {line}" for line in diff_paths(outcome.triton.as_dict(), outcome.appliance.as_dict(), width)]
    return "\n".join(lines)


def diff_paths(triton: Any, appliance: Any, width: int = 300, path: str = "") -> list[str]:
    if isinstance(triton, dict) and isinstance(appliance, dict):
        found = []
        for key in sorted(set(triton) | set(appliance), key=str):
            if key not in triton:
                found.append(f"{path}.{key}: <absent> != {_short(appliance[key], width)}")
            elif key not in appliance:
                found.append(f"{path}.{key}: {_short(triton[key], width)} != <absent>")
            else:
                found += diff_paths(triton[key], appliance[key], width, f"{path}.{key}")
        return found
    if isinstance(triton, list) and isinstance(appliance, list) and len(triton) == len(appliance):
        found = []
        for index, (left, right) in enumerate(zip(triton, appliance)):
            found += diff_paths(left, right, width, f"{path}[{index}]")
        return found
    return [] if triton == appliance else [f"{path or '.'}: {_short(triton, width)} != {_short(appliance, width)}"]


def _short(value: Any, width: int) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= width else text[: width - 3] + "..."
