"""Run a scenario module inside a private network namespace (multicast never leaves it); the scenario
prints its result as one JSON line, last."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
NETNS_SETUP = "ip link set lo up && ip link set lo multicast on && ip route add 224.0.0.0/4 dev lo"


def netns_unavailable() -> str | None:
    """Why a private network namespace cannot be made here, or None when it can."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip (util-linux, iproute2) is not installed"
    probe = subprocess.run(["unshare", "-n", "sh", "-c", NETNS_SETUP], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make a private network namespace here: {probe.stderr.strip()}"
    return None


def run_scenario(module: str, what: str, timeout: float, stderr_tail: int = 3000) -> dict:
    """``python -m module`` in a fresh network namespace, its JSON result; the test is skipped (naming
    ``what`` needs it) where no namespace can be made."""
    reason = netns_unavailable()
    if reason:
        pytest.skip(f"{what} need a private network namespace so multicast never leaves it: {reason}")
    command = f"{NETNS_SETUP} && exec {sys.executable} -m {module}"
    result = subprocess.run(["unshare", "-n", "bash", "-c", command], capture_output=True, text=True,
                            timeout=timeout, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-stderr_tail:]
    return json.loads(result.stdout.strip().splitlines()[-1])
