"""What a probe found: sections per step, plus the readings that backend selection and logs need."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from hardware_probe.fingerprint import compute_fingerprint
from hardware_probe.sections import RUNTIMES, find_present, find_runtime, list_runtime_versions

__all__ = ["ProbeReport"]


def _format_bytes(count: int | None) -> str:
    return "?" if count is None else f"{count / 2**30:.1f} GiB"


def _short_version(version: str) -> str:
    # OpenVINO's version carries its build ("2026.4.1-22982-e213a147257-releases/2026/4").
    return version.split("-")[0]


def _render_cpu(cpu: dict) -> str:
    flags = " ".join(cpu.get("flags", [])) or "no listed ISA extensions"
    cores = f"{cpu.get('physical_cores')} cores / {cpu.get('logical_threads')} threads"
    return f"{cpu.get('vendor')} {cpu.get('model')}; {cpu.get('architecture')}; {cores}; {flags}"


def _render_memory(memory: dict) -> str:
    total, available = memory.get("total_bytes"), memory.get("available_bytes")
    return f"{_format_bytes(total)} total, {_format_bytes(available)} available"


def _render_nvidia(nvidia: dict) -> str:
    gpus = ", ".join(
        f"{gpu['name']} (compute {gpu['compute_capability']}, {_format_bytes(gpu['memory_total_bytes'])})"
        for gpu in nvidia.get("gpus", [])
    )
    return f"driver {nvidia.get('driver_version')}, CUDA {nvidia.get('cuda_driver_version')}; {gpus}"


def _render_jetson(jetson: dict) -> str:
    return "; ".join(part for part in (jetson.get("model"), jetson.get("l4t_release")) if part)


def _render_intel(intel: dict) -> str:
    parts = [f"GPU {gpu['path']} ({gpu.get('pci_device_id')})" for gpu in intel.get("gpus", [])]
    parts += [f"NPU {npu['path']} ({npu.get('pci_device_id')})" for npu in intel.get("npus", [])]
    openvino = intel.get("openvino", {})
    if openvino.get("status") == "present":
        parts.append("OpenVINO: " + ", ".join(f"{d} = {n}" for d, n in openvino.get("devices", {}).items()))
    return "; ".join(parts)


def _render_onnxruntime(runtime: dict) -> str:
    text = f"{runtime['version']}; loads {', '.join(runtime.get('loadable_providers', [])) or 'nothing'}"
    failures = runtime.get("provider_failures", {})
    return text + (f"; fails {', '.join(failures)}" if failures else "")


def _render_openvino(runtime: dict) -> str:
    return f"{runtime['version']}; devices {', '.join(runtime.get('devices', [])) or 'none'}"


def _render_torch(runtime: dict) -> str:
    if not runtime.get("cuda_available"):
        return f"{runtime['version']}; no CUDA"
    devices = ", ".join(runtime.get("cuda_devices", []))
    return f"{runtime['version']}; CUDA {runtime.get('cuda_version')} on {devices}"


def _render_other(section: dict) -> str:
    details = {key: value for key, value in section.items() if key != "status"}
    return json.dumps(details, sort_keys=True, default=str)


_RENDERERS: dict[str, Callable[[dict], str]] = {
    "cpu": _render_cpu,
    "memory": _render_memory,
    "nvidia": _render_nvidia,
    "jetson": _render_jetson,
    "intel": _render_intel,
    "onnxruntime": _render_onnxruntime,
    "openvino": _render_openvino,
    "torch": _render_torch,
    "tensorrt": lambda runtime: str(runtime.get("version")),
}


def _render_row(name: str, section: dict) -> tuple[str, str, str]:
    status = str(section.get("status", "?"))
    if status != "present":
        return name, status, str(section.get("reason", ""))
    try:
        return name, status, _RENDERERS.get(name, _render_other)(section)
    except (KeyError, TypeError):  # a table is for people: show odd sections raw rather than fail
        return name, status, _render_other(section)


@dataclass(frozen=True)
class ProbeReport:
    """Sections keyed by step name; each has "status" ("present" or "absent", then with "reason")."""

    sections: dict[str, dict]

    @property
    def fingerprint(self) -> str:
        """16 hex characters naming this hardware and runtime set; see hardware_probe.fingerprint."""
        return compute_fingerprint(self.sections)

    @property
    def accelerators(self) -> list[str]:
        """"cpu" first, then "jetson" or "nvidia", "intel-gpu", "intel-npu" where present."""
        found = ["cpu"]
        nvidia = find_present(self.sections, "nvidia")
        # A Jetson's GPU is integrated and served with JetPack's wheels; NVML, where it answers there
        # at all, describes the same device, so one name is enough for backend selection.
        if find_present(self.sections, "jetson") is not None:
            found.append("jetson")
        elif nvidia is not None and nvidia.get("gpus"):
            found.append("nvidia")
        intel = find_present(self.sections, "intel")
        if intel is not None:
            openvino = intel.get("openvino", {}).get("devices", {})
            if intel.get("gpus") or any(device.startswith("GPU") for device in openvino):
                found.append("intel-gpu")
            if intel.get("npus") or any(device.startswith("NPU") for device in openvino):
                found.append("intel-npu")
        return found

    def cpu_flags(self) -> list[str]:
        """The ISA extensions in hardware_probe.cpu.ISA_FLAGS that this CPU has ("avx512_bf16", "sve")."""
        cpu = find_present(self.sections, "cpu")
        return list(cpu.get("flags", [])) if cpu else []

    def onnxruntime_providers(self) -> list[str]:
        """Providers that created a session, not merely the ones onnxruntime was built with."""
        runtime = find_runtime(self.sections, "onnxruntime")
        return list(runtime.get("loadable_providers", [])) if runtime else []

    def openvino_devices(self) -> list[str]:
        runtime = find_runtime(self.sections, "openvino")
        return list(runtime.get("devices", [])) if runtime else []

    def torch_cuda(self) -> bool:
        runtime = find_runtime(self.sections, "torch")
        return bool(runtime and runtime.get("cuda_available"))

    def tensorrt_version(self) -> str | None:
        return self.runtime_versions().get("tensorrt")

    def runtime_versions(self) -> dict[str, str]:
        """Installed runtimes only: {"onnxruntime": "1.32.0", ...}."""
        return list_runtime_versions(self.sections)

    def runtime_absences(self) -> dict[str, str]:
        """Why each runtime the probe looked for is absent (not installed, failed to import, cut off): the
        reason a fingerprint that keys cached plans may differ from the last start's."""
        runtimes = self.sections.get("runtimes", {})
        if runtimes.get("status") != "present":
            return {"runtimes": str(runtimes.get("reason", "not probed"))}
        return {name: str(section.get("reason", "")) for name, section in runtimes.items()
                if isinstance(section, dict) and section.get("status") == "absent"}

    def to_json(self) -> dict:
        return {"sections": self.sections, "fingerprint": self.fingerprint, "accelerators": self.accelerators}

    def table(self) -> str:
        """One row per section (runtimes one row each), for `appliance probe`."""
        rows = [("section", "status", "detail")]
        for name, section in self.sections.items():
            if name == "runtimes" and section.get("status") == "present":
                rows += [_render_row(runtime, section[runtime]) for runtime in RUNTIMES if runtime in section]
            else:
                rows.append(_render_row(name, section))
        rows += [("fingerprint", "", self.fingerprint), ("accelerators", "", ", ".join(self.accelerators))]
        name_width = max(len(row[0]) for row in rows)
        status_width = max(len(row[1]) for row in rows)
        return "\n".join(f"{n:<{name_width}}  {s:<{status_width}}  {d}".rstrip() for n, s, d in rows)

    def summary(self) -> str:
        """One line for the daemon's start-up log."""
        parts = [self._summarise_host(), f"accelerators: {', '.join(self.accelerators)}"]
        nvidia = find_present(self.sections, "nvidia")
        if nvidia is not None and nvidia.get("gpus"):
            gpus = ", ".join(f"{gpu['name']} ({gpu['compute_capability']})" for gpu in nvidia["gpus"])
            parts.append(f"gpus: {gpus}")
        parts.append(f"runtimes: {self._summarise_runtimes() or 'none'}")
        parts.append(f"fingerprint {self.fingerprint}")
        return "; ".join(parts)

    def _summarise_host(self) -> str:
        cpu = find_present(self.sections, "cpu")
        memory = find_present(self.sections, "memory")
        host = "unknown CPU"
        if cpu is not None:
            traits = [f"{cpu.get('logical_threads')} threads", " ".join(cpu.get("flags", []))]
            host = f"{cpu.get('model')} ({', '.join(trait for trait in traits if trait)})"
        return host if memory is None else f"{host}, {_format_bytes(memory.get('total_bytes'))}"

    def _summarise_runtimes(self) -> str:
        described = []
        if (ort := find_runtime(self.sections, "onnxruntime")) is not None:
            described.append(f"onnxruntime {ort['version']} [{', '.join(self.onnxruntime_providers())}]")
        if (openvino := find_runtime(self.sections, "openvino")) is not None:
            devices = ", ".join(self.openvino_devices())
            described.append(f"openvino {_short_version(openvino['version'])} [{devices}]")
        if (torch := find_runtime(self.sections, "torch")) is not None:
            described.append(f"torch {torch['version']}" + (" [cuda]" if self.torch_cuda() else ""))
        if (tensorrt := self.tensorrt_version()) is not None:
            described.append(f"tensorrt {tensorrt}")
        return ", ".join(described)
