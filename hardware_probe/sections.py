"""Read a probe's sections without caring whether a step was absent, timed out or never ran."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["RUNTIMES", "find_present", "find_runtime", "list_runtime_versions"]

RUNTIMES = ("onnxruntime", "openvino", "torch", "tensorrt")


def find_present(sections: Mapping[str, dict], name: str) -> dict | None:
    section = sections.get(name)
    return section if section is not None and section.get("status") == "present" else None


def find_runtime(sections: Mapping[str, dict], name: str) -> dict | None:
    runtimes = find_present(sections, "runtimes") or {}
    return find_present(runtimes, name)


def list_runtime_versions(sections: Mapping[str, dict]) -> dict[str, str]:
    versions = {}
    for name in RUNTIMES:
        runtime = find_runtime(sections, name)
        if runtime is not None and runtime.get("version"):
            versions[name] = str(runtime["version"])
    return versions
