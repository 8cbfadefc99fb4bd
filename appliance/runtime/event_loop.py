"""The daemon's event loop: uvloop where it is installed (the default flavour's optional dependency),
asyncio's own loop otherwise or when the settings ask for it (``event_loop``: auto, uvloop, asyncio)."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from appliance.core.errors import ConfigError

__all__ = ["EVENT_LOOPS", "loop_factory", "loop_name", "run"]

EVENT_LOOPS = ("auto", "uvloop", "asyncio")
T = TypeVar("T")


def loop_name(choice: str) -> str:
    """The loop ``choice`` resolves to on this box: "uvloop" or "asyncio"."""
    if choice not in EVENT_LOOPS:
        raise ConfigError(f"event_loop must be one of {', '.join(EVENT_LOOPS)}, got {choice!r}")
    installed = importlib.util.find_spec("uvloop") is not None
    if choice == "uvloop" and not installed:
        raise ConfigError("event_loop is uvloop, but uvloop is not installed: pip install uvloop, or set "
                          "event_loop to auto or asyncio (APPLIANCE_EVENT_LOOP)")
    return "uvloop" if choice == "uvloop" or (choice == "auto" and installed) else "asyncio"


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """A factory for asyncio.Runner, or None for asyncio's default loop."""
    if loop_name(choice) == "asyncio":
        return None
    import uvloop

    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], choice: str) -> T:
    """asyncio.run on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main)
