"""What the registry offers the code that loads and calls models on its behalf (BLS calls from model
processes, pushed files), as a Protocol: those modules sit below the registry and import nothing of it."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from appliance.engine.model import ModelVersion

__all__ = ["Models"]


class Models(Protocol):
    repository: Path
    """The model repository's directory."""

    def get(self, name: str, version: str | None = None) -> ModelVersion:
        """The version that serves (ModelNotFound, ModelNotReady)."""
        ...

    def model_dir(self, name: str) -> Path:
        """Where ``name`` lives (checks the name first)."""
        ...

    def in_repository(self, name: str) -> bool: ...

    async def load(self, name: str, config_override: Any = None, raise_errors: bool = True,
                   traffic: dict[int, dict] | None = None, source: Path | None = None) -> Any: ...

    async def unload(self, name: str, reason: str = "unloaded", unload_dependents: bool = False) -> None: ...

    def hold(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Keep re-scans and retunes off ``name`` while a push replaces its files."""
        ...

    def forget(self, name: str) -> None: ...
