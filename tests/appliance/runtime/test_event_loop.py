"""The daemon's event loop choice: uvloop where installed, asyncio's otherwise or when asked."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from appliance.core.errors import ConfigError
from appliance.runtime import event_loop
from appliance.settings import Settings

HAS_UVLOOP = importlib.util.find_spec("uvloop") is not None


def test_asyncio_is_always_available():
    assert event_loop.loop_name("asyncio") == "asyncio"
    assert event_loop.loop_factory("asyncio") is None


def test_auto_takes_uvloop_when_installed():
    assert event_loop.loop_name("auto") == ("uvloop" if HAS_UVLOOP else "asyncio")


@pytest.mark.skipif(not HAS_UVLOOP, reason="uvloop is not installed")
def test_run_uses_the_chosen_loop():
    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert event_loop.run(loop_module(), "uvloop").startswith("uvloop")
    assert event_loop.run(loop_module(), "asyncio").startswith("asyncio")


def test_uvloop_asked_for_but_missing_says_how_to_fix(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="pip install uvloop"):
        event_loop.loop_name("uvloop")
    assert event_loop.loop_name("auto") == "asyncio"


def test_an_unknown_loop_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="auto, uvloop or asyncio"):
        Settings.build(state_dir=tmp_path, event_loop="trio")
    with pytest.raises(ConfigError, match="event_loop must be one of"):
        event_loop.loop_name("trio")
