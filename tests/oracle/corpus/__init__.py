"""The request corpus sent to real Triton and to the appliance, in order (some cases change state)."""

from __future__ import annotations

from tests.oracle.corpus.case import Case
from tests.oracle.corpus.control import health_and_metadata, logging, repository_index, statistics, trace
from tests.oracle.corpus.infer import errors, inference
from tests.oracle.corpus.repository import control_refused, load_unload
from tests.oracle.corpus.shm import Regions, regions, shared_memory_cases
from tests.oracle.corpus.streams import decoupled, generate, sequences

__all__ = ["Case", "Regions", "explicit_mode_corpus", "none_mode_corpus", "regions"]


def explicit_mode_corpus(made: Regions) -> list[Case]:
    """Everything but the mode-none refusals, for servers in explicit mode with every model loaded."""
    cases = [*health_and_metadata(), *repository_index("start"), *inference(), *errors(), *sequences(),
             *decoupled(), *generate(), *shared_memory_cases(made), *trace(), *logging(), *statistics(),
             *load_unload()]
    _check_unique(cases)
    return cases


def none_mode_corpus() -> list[Case]:
    cases = control_refused()
    _check_unique(cases)
    return cases


def _check_unique(cases: list[Case]) -> None:
    seen: set[str] = set()
    for case in cases:
        if case.name in seen:
            raise ValueError(f"two corpus cases are named {case.name!r}")
        seen.add(case.name)
