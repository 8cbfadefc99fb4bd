"""What a tuning run is asked to do: the settings it measures with, what it tunes for, the box it runs
on, and the job a tuning child process gets (``python -m appliance.selection.worker``).

Both sides of the process boundary import this module; neither imports the other.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import LoadContext, RuntimeOptions
from appliance.repository.plan_choice import TuneRequest
from appliance.selection.inputs import DYNAMIC_SIZES
from appliance.selection.plans import ProbeView

__all__ = ["Hardware", "SelectionSettings", "TuneRequest", "TuningJob"]


@dataclasses.dataclass(frozen=True)
class SelectionSettings:
    budget: float = 0.3
    """Seconds of timing per candidate and batch size."""
    build_timeout: float = 120.0
    atol: float = 1e-4
    rtol: float = 1e-3
    reduced_atol: float = 2e-2
    reduced_rtol: float = 2e-2
    dynamic_sizes: tuple[int, ...] = DYNAMIC_SIZES
    """Sizes tried for variable dimensions when synthetic inputs are all there is to tune with."""


@dataclasses.dataclass(frozen=True)
class Hardware:
    """What selection knows of this box: the probe (which plans can run) and what names a measurement
    in the cache key (the fingerprint and the runtimes' versions)."""

    probe: ProbeView
    fingerprint: str
    runtime_versions: dict[str, str]
    cpu_flags: tuple[str, ...] = ()

    @classmethod
    def of(cls, report: Any) -> Hardware:
        """From hardware_probe's ProbeReport."""
        return cls(report, report.fingerprint, report.runtime_versions(), tuple(report.cpu_flags()))

    def as_json(self) -> dict[str, Any]:
        return {"probe": getattr(self.probe, "sections", {}), "fingerprint": self.fingerprint,
                "runtime_versions": self.runtime_versions, "cpu_flags": list(self.cpu_flags)}

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> Hardware:
        from hardware_probe import ProbeReport

        return cls(ProbeReport(sections=document["probe"]), document["fingerprint"], document["runtime_versions"],
                   tuple(document["cpu_flags"]))


@dataclasses.dataclass(frozen=True)
class TuningJob:
    """One tuning run, as the daemon hands it to a child process: JSON on the child's stdin."""

    backend: str
    context: LoadContext
    hardware: Hardware
    settings: SelectionSettings
    cache_dir: Path
    cache_max_bytes: int
    cache_writable: bool
    key: str
    """The cache key: the model files are hashed once, by the daemon."""
    request: TuneRequest
    nice: int = 0
    """A retune on traffic runs beside the model it serves: at low CPU priority."""

    def to_json(self) -> str:
        context = self.context
        return json.dumps({
            "backend": self.backend,
            "model_name": context.model_name,
            "version": context.version,
            "model_file": str(context.model_file),
            "config": json_format.MessageToDict(context.config, preserving_proto_field_name=True),
            "options": dataclasses.asdict(context.options),
            "threads": context.threads,
            "hardware": self.hardware.as_json(),
            "settings": dataclasses.asdict(self.settings),
            "cache_dir": str(self.cache_dir),
            "cache_max_bytes": self.cache_max_bytes,
            "cache_writable": self.cache_writable,
            "key": self.key,
            "request": dataclasses.asdict(self.request),
            "nice": self.nice,
        })

    @classmethod
    def from_json(cls, text: str) -> TuningJob:
        job = json.loads(text)
        options = job["options"]
        context = LoadContext(
            job["model_name"], job["version"], Path(job["model_file"]),
            json_format.ParseDict(job["config"], mc.ModelConfig()),
            RuntimeOptions(**{**options, "onnx_providers": tuple(options["onnx_providers"])}),
            threads=job["threads"],
        )
        settings = job["settings"]
        return cls(
            backend=job["backend"],
            context=context,
            hardware=Hardware.from_json(job["hardware"]),
            settings=SelectionSettings(**{**settings, "dynamic_sizes": tuple(settings["dynamic_sizes"])}),
            cache_dir=Path(job["cache_dir"]),
            cache_max_bytes=job["cache_max_bytes"],
            cache_writable=job["cache_writable"],
            key=job["key"],
            request=TuneRequest(**job["request"]),
            nice=job["nice"],
        )
