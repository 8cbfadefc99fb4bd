"""What this box has: CPU, memory, accelerators and runtimes. A library with no HTTP in it.

    report = hardware_probe.probe()
    log.info("hardware: %s", report.summary())
    report.onnxruntime_providers()  # ["CPUExecutionProvider", ...], the ones that really load

Importing this package imports no runtime; each probe step imports what it needs when it runs.
"""

from hardware_probe.cached import probe_cached
from hardware_probe.isolated import probe_isolated
from hardware_probe.probe import DEFAULT_TIMEOUT, probe
from hardware_probe.report import ProbeReport
from hardware_probe.step import Step
from hardware_probe.steps import DEFAULT_STEPS

__all__ = ["DEFAULT_STEPS", "DEFAULT_TIMEOUT", "ProbeReport", "Step", "probe", "probe_cached", "probe_isolated"]
