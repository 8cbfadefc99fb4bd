"""System samples: CPU, load, memory, this process's RSS, temperatures, and NVIDIA GPUs via NVML."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import psutil

__all__ = ["SystemSampler"]

log = logging.getLogger(__name__)


class SystemSampler:
    """Call ``sample()`` from one thread (the metrics writer): psutil's CPU percent is relative to the
    previous call, and NVML handles stay open between calls."""

    def __init__(self) -> None:
        self._process = psutil.Process(os.getpid())
        psutil.cpu_percent(None)
        self._nvml: Any = None
        self._gpus: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._gpus = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception as exc:  # no NVIDIA library or driver: simply no GPU samples
            log.debug("no NVML: %s", exc)

    def sample(self) -> dict[str, Any]:
        memory = psutil.virtual_memory()
        row: dict[str, Any] = {
            "t": int(time.time()),
            "cpu_percent": psutil.cpu_percent(None),
            "load1": os.getloadavg()[0],
            "memory_total": memory.total,
            "memory_used": memory.total - memory.available,
            "memory_percent": memory.percent,
            "rss_bytes": self._process.memory_info().rss,
            "temperatures": self._temperatures(),
            "gpus": self._gpu_samples(),
        }
        return row

    @staticmethod
    def _temperatures() -> dict[str, float]:
        reader = getattr(psutil, "sensors_temperatures", None)
        if reader is None:
            return {}
        try:
            return {f"{name}/{entry.label or i}": entry.current
                    for name, entries in reader().items() for i, entry in enumerate(entries)}
        except OSError:
            return {}

    def _gpu_samples(self) -> list[dict[str, Any]]:
        samples = []
        for index, handle in enumerate(self._gpus):
            nvml = self._nvml
            try:
                utilization = nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                samples.append({
                    "index": index,
                    "utilization_percent": utilization.gpu,
                    "memory_used": memory.used,
                    "memory_total": memory.total,
                    "power_watts": nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                    "temperature_c": nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
                })
            except Exception as exc:
                samples.append({"index": index, "error": str(exc)})
        return samples

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
