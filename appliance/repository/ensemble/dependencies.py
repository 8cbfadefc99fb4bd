"""Which models an ensemble needs, and which ensembles need a model: the registry loads the first before
the ensemble and takes the ensemble down when one of them goes."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from appliance.repository.ensemble.plan import EnsemblePlan

__all__ = ["find_cycle", "users_of"]


def find_cycle(name: str, plan: EnsemblePlan, plan_of: Callable[[str], EnsemblePlan | None]) -> list[str] | None:
    """A chain of ensembles leading from ``name`` back to itself (``plan_of(model)``: the plan of a
    composing model that is an ensemble, None for any other model), or None."""
    path = [name]
    seen: set[str] = set()

    def visit(models: set[str]) -> list[str] | None:
        for model in sorted(models):
            if model == name:
                return [*path, model]
            if model in seen:
                continue
            seen.add(model)
            inner = plan_of(model)
            if inner is None:
                continue
            path.append(model)
            found = visit(inner.models())
            if found:
                return found
            path.pop()
        return None

    return visit(plan.models())


def users_of(model: str, plans: Mapping[str, EnsemblePlan]) -> list[str]:
    """The ensembles (among ``plans``) with a step running ``model``."""
    return sorted(name for name, plan in plans.items() if model in plan.models())
