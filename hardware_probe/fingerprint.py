"""A short, stable name for "this hardware with these runtimes", to key compiled artefacts and timings."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from hardware_probe.sections import find_present, list_runtime_versions

__all__ = ["FINGERPRINT_LENGTH", "compute_fingerprint", "describe_fingerprint"]

# 16 hex characters = 64 bits of sha256: collisions among the boxes one fleet will ever hold are
# out of reach, and the name stays short enough for file names and log lines.
FINGERPRINT_LENGTH = 16


def _describe_cpu(sections: Mapping[str, dict]) -> dict | None:
    cpu = find_present(sections, "cpu")
    if cpu is None:
        return None
    # Thread count is in because tuned timings (and Triton's instance counts) depend on it.
    return {
        "model": cpu.get("model"),
        "flags": sorted(cpu.get("flags", [])),
        "threads": cpu.get("logical_threads"),
    }


def _describe_nvidia(sections: Mapping[str, dict]) -> dict | None:
    nvidia = find_present(sections, "nvidia")
    if nvidia is None:
        return None
    gpus = sorted([gpu.get("name"), gpu.get("compute_capability")] for gpu in nvidia.get("gpus", []))
    return {"driver_version": nvidia.get("driver_version"), "gpus": gpus}


def _describe_jetson(sections: Mapping[str, dict]) -> str | None:
    # The L4T release pins the JetPack TensorRT and CUDA that a Jetson engine was built with.
    jetson = find_present(sections, "jetson")
    return None if jetson is None else (jetson.get("l4t_release") or jetson.get("model"))


def _describe_intel(sections: Mapping[str, dict]) -> dict | None:
    intel = find_present(sections, "intel")
    if intel is None:
        return None
    return {
        "gpus": sorted(str(gpu.get("pci_device_id")) for gpu in intel.get("gpus", [])),
        "npus": sorted(str(npu.get("pci_device_id")) for npu in intel.get("npus", [])),
    }


def describe_fingerprint(sections: Mapping[str, dict]) -> dict:
    """Exactly what the fingerprint hashes: nothing that changes between two probes of one box
    (free memory, device paths, driver load order), so compare these when two fingerprints differ."""
    return {
        "cpu": _describe_cpu(sections),
        "nvidia": _describe_nvidia(sections),
        "jetson": _describe_jetson(sections),
        "intel": _describe_intel(sections),
        "runtimes": list_runtime_versions(sections),
    }


def compute_fingerprint(sections: Mapping[str, dict]) -> str:
    """The first FINGERPRINT_LENGTH hex characters of sha256 over describe_fingerprint's canonical JSON.

    A step cut off by the probe's timeout reads as absent and so changes the fingerprint: callers that
    key caches with it should give probe() a timeout that a cold start of every runtime fits in.
    """
    canonical = json.dumps(describe_fingerprint(sections), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:FINGERPRINT_LENGTH]
