"""The application starts whatever the state dir holds: the control token's side of it."""

from __future__ import annotations

import pytest

from appliance.errors import ConfigError
from appliance.rest.app import build_app
from appliance.settings import Settings
from appliance.state import StateDir
from tests.readonly import unwritable


def test_the_daemon_starts_without_a_writable_place_for_its_token(tmp_path):
    state = StateDir.check(unwritable(tmp_path))
    build_app(Settings(state_dir=state.path), state)  # no OSError
    assert "token_not_saved" in [p.kind for p in state.problems]


def test_an_empty_token_file_stops_the_start_with_the_fix(tmp_path):
    (tmp_path / "auth-token").write_text("")
    with pytest.raises(ConfigError, match="delete the file"):
        build_app(Settings(state_dir=tmp_path), StateDir.check(tmp_path))
