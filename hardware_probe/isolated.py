"""Probe in a child process: importing torch, OpenVINO or TensorRT to see what they can do costs a
daemon hundreds of MiB it never gets back, even when it serves only ONNX models."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

from hardware_probe.probe import DEFAULT_TIMEOUT, probe
from hardware_probe.report import ProbeReport

__all__ = ["probe_isolated"]

log = logging.getLogger(__name__)


def probe_isolated(timeout: float = DEFAULT_TIMEOUT) -> ProbeReport:
    """Like probe(), in a fresh interpreter; falls back to probing here if the child cannot run."""
    try:
        result = subprocess.run([sys.executable, "-m", "hardware_probe", str(timeout)], capture_output=True,
                                text=True, timeout=timeout * 3 + 30, check=True)
        return ProbeReport(sections=json.loads(result.stdout)["sections"])
    except (subprocess.SubprocessError, OSError, ValueError, KeyError) as exc:
        log.warning("probing in a child process failed (%s); probing in this process instead", exc)
        return probe(timeout=timeout)
