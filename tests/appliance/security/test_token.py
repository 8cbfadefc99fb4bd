"""The control token on disk."""

from __future__ import annotations

import stat
import subprocess
import sys
import threading

import pytest

from appliance.core.errors import ConfigError
from appliance.security.token import ensure_token
from appliance.settings import Settings


def test_token_is_created_whole_and_private(tmp_path):
    token = ensure_token(tmp_path)
    path = tmp_path / "auth-token"
    assert len(token) >= 32 and path.read_text() == token + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["auth-token"]  # no temporary file left behind
    assert ensure_token(tmp_path) == token


def test_racing_starts_agree_on_one_token(tmp_path):
    tokens: list[str] = []
    threads = [threading.Thread(target=lambda: tokens.append(ensure_token(tmp_path))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(tokens)) == 1 and len(tokens) == 8


@pytest.mark.parametrize("content", ["", "\n", "short\n"])
def test_an_empty_or_short_token_file_is_refused(tmp_path, content):
    (tmp_path / "auth-token").write_text(content)
    with pytest.raises(ConfigError, match="delete the file"):
        ensure_token(tmp_path)


def test_daemon_refuses_to_start_with_an_empty_token(tmp_path):
    (tmp_path / "auth-token").write_text("")
    result = subprocess.run(
        [sys.executable, "-m", "appliance", "serve", "--no-metrics-port",
         "--host", "127.0.0.1", "--http-port", "0", "--no-mdns",
         "--state-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "delete the file" in result.stderr


def test_a_short_token_setting_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="at least 16"):
        Settings.build(state_dir=tmp_path, auth_token="  ")
    with pytest.raises(ConfigError, match="not a network"):
        Settings.build(state_dir=tmp_path, trusted_proxies=("proxy.lan",))
