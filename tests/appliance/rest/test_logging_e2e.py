"""Triton's logging extension over REST: the running daemon's log settings, read and changed."""

from __future__ import annotations

import re

import pytest

from appliance.examples import build_example_repository
from tests.http_util import call
from tests.waiting import wait_until

REMOTE = "127.0.0.2"


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return build_example_repository(tmp_path_factory.mktemp("x") / "repo")


@pytest.fixture(scope="module")
def daemon(module_daemon, repository):
    return module_daemon(repository, env={"APPLIANCE_AUTH_EXEMPT_NETWORKS": "127.0.0.1/32"})


def test_settings_are_read_and_changed_at_run_time(daemon):
    status, _, settings = call(daemon.port, "GET", "/v2/logging")
    assert status == 200 and settings["log_info"] is True and settings["log_verbose_level"] == 0
    assert settings["log_format"] == "default"
    status, _, changed = call(daemon.port, "POST", "/v2/logging", {"log_verbose_level": 1, "log_format": "ISO8601"})
    assert status == 200 and changed["log_verbose_level"] == 1 and changed["log_format"] == "ISO8601"
    assert call(daemon.port, "GET", "/v2/logging")[2] == changed
    # The change is logged in the new format: ISO 8601 UTC time stamps.
    line = wait_until(lambda: next((x for x in daemon.log().splitlines() if "log_format=ISO8601" in x), ""),
                      timeout=5, what="the change logged", interval=0.1)
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO", line), line
    call(daemon.port, "POST", "/v2/logging", {"log_info": False})
    call(daemon.port, "POST", "/v2/logging", {"log_format": "default"})  # an INFO line, not written now
    assert not any("log_format=default" in x for x in daemon.log().splitlines())
    assert call(daemon.port, "POST", "/v2/logging", {"log_info": True, "log_verbose_level": 0})[0] == 200
    assert call(daemon.port, "POST", "/v2/logging", {"log_verbose_level": 0, "log_format": "default"})[0] == 200


# Each refusal is tested below the transports (tests/appliance/protocol/test_log_settings.py): here, that
# they come back as HTTP statuses.
@pytest.mark.parametrize("body, status, words", [
    ({"log_info": "yes"}, 400, "expect boolean"),
    ({"log_file": "/tmp/x.log"}, 501, "can not be updated"),
])
def test_bad_settings_are_refused(daemon, body, status, words):
    got, _, payload = call(daemon.port, "POST", "/v2/logging", body)
    assert got == status and words in payload["error"], payload


def test_changing_settings_is_a_control_endpoint(daemon):
    assert call(daemon.port, "POST", "/v2/logging", {"log_info": True}, source=REMOTE)[0] == 401
    assert call(daemon.port, "GET", "/v2/logging", source=REMOTE)[0] == 200
    assert call(daemon.port, "POST", "/v2/logging", b'{"log_info": true}',
                headers={"Content-Type": "text/plain"})[0] == 415
    assert "logging" in call(daemon.port, "GET", "/v2")[2]["extensions"]
