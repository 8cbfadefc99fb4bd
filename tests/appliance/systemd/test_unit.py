"""The systemd unit: one source, verified by systemd-analyze, exposure at most 2.5."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.settings import Settings
from appliance.systemd.unit import DEFAULT_EXEC, hidden_from_the_service, render_unit

ROOT = Path(__file__).resolve().parents[3]
needs_systemd = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                   reason="systemd-analyze is not installed "
                                          "(Debian's systemd package; .ci/run installs it)")


def test_committed_unit_is_the_default_rendering():
    assert (ROOT / "systemd" / "appliance.service").read_text() == render_unit()


@needs_systemd
def test_unit_verifies_clean(tmp_path):
    unit = tmp_path / "appliance.service"
    unit.write_text(render_unit(str(Path(sys.executable).with_name("appliance"))))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "", result.stdout + result.stderr
    assert "appliance.service" not in result.stderr, result.stderr


@needs_systemd
def test_exposure_is_at_most_2_5():
    unit = ROOT / "systemd" / "appliance.service"
    result = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)],
                            capture_output=True, text=True)
    match = re.search(r"Overall exposure level for appliance\.service: ([\d.]+)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= 2.5


def test_install_service_writes_this_venvs_executable(tmp_path):
    target = tmp_path / "appliance.service"
    result = subprocess.run([sys.executable, "-m", "appliance", "install-service", "--unit-path", str(target),
                             "--model-repository", "/srv/models"], capture_output=True, text=True, check=True)
    text = target.read_text()
    executable = Path(sys.executable).with_name("appliance")
    assert f"ExecStart={executable} serve --model-repository /srv/models" in text
    assert "Type=notify" in text and "systemctl daemon-reload" in result.stdout


def test_descriptor_limit_leaves_room_for_max_connections():
    limit = int(re.search(r"^LimitNOFILE=(\d+)$", render_unit(), re.MULTILINE).group(1))
    assert limit >= Settings.build(state_dir=Path("/tmp")).http.max_connections + 1024


def test_install_service_passes_the_grpc_choice(tmp_path):
    target = tmp_path / "appliance.service"
    subprocess.run([sys.executable, "-m", "appliance", "install-service", "--unit-path", str(target),
                    "--grpc-port", "9001"], capture_output=True, text=True, check=True)
    assert re.search(r"^ExecStart=\S+ serve --grpc-port 9001$", target.read_text(), re.MULTILINE)
    printed = subprocess.run([sys.executable, "-m", "appliance", "install-service", "--no-grpc", "--print"],
                             capture_output=True, text=True, check=True).stdout
    assert re.search(r"^ExecStart=\S+ serve --no-grpc$", printed, re.MULTILINE)
    assert "over gRPC on 8001" in render_unit()


def test_install_service_passes_the_http_port(tmp_path):
    printed = subprocess.run([sys.executable, "-m", "appliance", "install-service", "--http-port", "9000",
                              "--grpc-port", "9001", "--print"], capture_output=True, text=True, check=True).stdout
    assert re.search(r"^ExecStart=\S+ serve --http-port 9000 --grpc-port 9001$", printed, re.MULTILINE)


@pytest.mark.parametrize(("path", "setting"), [("/tmp/checkout/repo", "PrivateTmp=yes"),
                                               ("/var/tmp/models", "PrivateTmp=yes"),
                                               ("/home/ana/models", "ProtectHome=yes"),
                                               ("/root/venv/bin/appliance", "ProtectHome=yes")])
def test_a_path_the_sandbox_hides_is_warned_about(path, setting):
    (warning,) = hidden_from_the_service({"model repository": path})
    assert path in warning and setting in warning and "/opt" in warning


def test_paths_the_service_can_see_are_not_warned_about():
    assert hidden_from_the_service({"model repository": "/srv/models", "appliance executable": DEFAULT_EXEC,
                                    "x": "/tmpfoo/models"}) == []


def test_install_service_warns_of_a_repository_under_tmp(tmp_path):
    result = subprocess.run([sys.executable, "-m", "appliance", "install-service", "--print", "--model-repository",
                             "/tmp/my-models"], capture_output=True, text=True, check=True)
    assert "warning: the model repository /tmp/my-models is under /tmp" in result.stderr
