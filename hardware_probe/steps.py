"""The steps probe() runs when not given any."""

from __future__ import annotations

from hardware_probe.cpu import probe_cpu, probe_memory
from hardware_probe.intel import probe_intel
from hardware_probe.nvidia import probe_jetson, probe_nvidia
from hardware_probe.runtimes import probe_runtimes
from hardware_probe.step import Step

__all__ = ["DEFAULT_STEPS"]

DEFAULT_STEPS: tuple[Step, ...] = (
    Step("cpu", probe_cpu),
    Step("memory", probe_memory),
    Step("nvidia", probe_nvidia),
    Step("jetson", probe_jetson),
    Step("intel", probe_intel),
    Step("runtimes", probe_runtimes),
)
