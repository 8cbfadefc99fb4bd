"""How the repository asks for a model version's plan, without knowing who measures it.

The loader hands a ``PlanChooser`` (``appliance.selection.Selector`` is the daemon's) the backend a config
asks for and the first instance's context; the ``PlanChoice`` it gets back says whether to serve the
config as is or a measured plan (another backend, an instance count, threads). Selection plugs in here,
handed to the registry at construction: the repository imports nothing of it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Protocol

from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import BackendInfo, LoadContext

__all__ = ["ChosenPlan", "PlanChoice", "PlanChooser", "TuneRequest"]


@dataclasses.dataclass(frozen=True)
class TuneRequest:
    """What a model version is tuned for beyond its config (part of the cache key)."""

    explicit_instances: bool = False
    """The user's config sets instance_group: the instances are kept unless it sets tune_instances."""
    traffic: dict[str, Any] | None = None
    """A retune on real traffic: the traffic's profile (appliance.engine.traffic), tuned on first; None at load."""


class ChosenPlan(Protocol):
    @property
    def id(self) -> str:
        """The plan's id: its instances are loaded with it as ``LoadContext.plan`` (never from the config)."""
        ...

    @property
    def backend(self) -> str:
        """The backend that serves the plan."""
        ...

    @property
    def instances(self) -> int:
        """Instances to run; 0: as the config says."""
        ...

    @property
    def threads(self) -> int:
        """Threads inside one operator, per instance; 0: the box's cores shared among the instances."""
        ...

    def apply(self, config: mc.ModelConfig) -> mc.ModelConfig:
        """The config the plan's instances are loaded with."""
        ...


class PlanChoice(Protocol):
    @property
    def plan(self) -> ChosenPlan: ...

    @property
    def decision(self) -> dict[str, Any]:
        """Why, as JSON (``/v2/models/<m>/selection``)."""
        ...

    @property
    def cache(self) -> str:
        """"hit", "miss" or "off"."""
        ...

    @property
    def artefacts(self) -> Path | None: ...

    @property
    def measured(self) -> bool:
        """Serve with the plan (the other outcomes serve the config as is)."""
        ...

    @property
    def unmeasured(self) -> bool:
        """No candidate could be measured: served on the plan the config pins (``pinned``), else on the
        config's default plan, as --no-selection."""
        ...

    @property
    def pinned(self) -> bool:
        """Nothing could be measured, and the config pins the plan: serve with it."""
        ...


class PlanChooser(Protocol):
    def choose(self, info: BackendInfo, context: LoadContext, *, force: bool = False,
               request: TuneRequest = TuneRequest()) -> PlanChoice:
        """The plan for the version ``context`` describes; ``force`` measures again even when cached."""
        ...
