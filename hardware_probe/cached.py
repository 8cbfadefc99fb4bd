"""A probe report kept in a file and reused while nothing it depends on changed.

A full probe imports every runtime (onnxruntime, OpenVINO, torch, TensorRT) in a child process: seconds of
CPU at every start, during which the daemon answers ready = 503. What the report says changes only with
the box (a reboot: new devices, a new driver), the runtimes installed, or the probe's own code, so the
report is kept with a key of exactly those: the kernel's boot id, the interpreter, the versions of the
runtime distributions, the accelerator device nodes present, the CPU count and memory size, and a digest
of this package's source. Any of them changed, or the file unreadable, and the box is probed again. The
memory section (what is available now) is read afresh on every use: it is cheap and it moves.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

from hardware_probe.cpu import probe_memory
from hardware_probe.isolated import probe_isolated
from hardware_probe.probe import DEFAULT_TIMEOUT
from hardware_probe.report import ProbeReport

__all__ = ["environment_key", "probe_cached"]

log = logging.getLogger(__name__)

_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "openvino", "torch", "tensorrt",
                  "nvidia-ml-py", "pynvml", "numpy", "onnx")
_DEVICE_GLOBS = ("nvidia*", "dri/*", "accel/*", "nvhost-*", "nvmap")
_MAX_FILE_BYTES = 1 << 20  # a report is a few KiB: anything larger is not one of ours
_FORMAT = 1


def environment_key() -> str:
    """What a probe report depends on, as a digest (cheap: no runtime is imported)."""
    parts: dict[str, object] = {
        "format": _FORMAT,
        "boot": _read("/proc/sys/kernel/random/boot_id"),
        "python": [sys.executable, sys.version],
        "distributions": {name: _version(name) for name in _DISTRIBUTIONS},
        "devices": sorted(str(p) for pattern in _DEVICE_GLOBS for p in Path("/dev").glob(pattern)),
        "cpus": os.cpu_count(),
        "memory": _read("/proc/meminfo").split("\n", 1)[0],
        "probe": _source_digest(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def probe_cached(path: Path | None, timeout: float = DEFAULT_TIMEOUT) -> tuple[ProbeReport, bool]:
    """The report kept at ``path`` when its key is this box's now (``True``), else a fresh probe in a child
    process, kept there for next time (``False``). ``path`` None: always probe, keep nothing (blocking)."""
    key = environment_key() if path is not None else ""
    if path is not None:
        sections = _load(path, key)
        if sections is not None:
            sections["memory"] = {"status": "present", **probe_memory()}
            return ProbeReport(sections), True
    report = probe_isolated(timeout)
    if path is not None and not _cut_off(report):
        _save(path, key, report)
    return report, False


def _cut_off(report: ProbeReport) -> bool:
    """A step that timed out is not what the box has: such a report is used once, never kept."""
    return any("timed out after" in str(section.get("reason", "")) for section in report.sections.values())


def _load(path: Path, key: str) -> dict[str, dict] | None:
    try:
        with path.open("rb") as f:
            data = json.loads(f.read(_MAX_FILE_BYTES + 1))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.info("the kept hardware probe report %s is unreadable (%s): probing again", path, exc)
        return None
    if not isinstance(data, dict) or data.get("key") != key:
        return None
    sections = data.get("sections")
    if not isinstance(sections, dict) or not all(isinstance(v, dict) for v in sections.values()):
        return None
    return sections


def _save(path: Path, key: str, report: ProbeReport) -> None:
    """Written whole (a temporary file renamed over the old one): daemons sharing the file never read half
    of one; a directory that takes no writes keeps nothing."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=".hardware-probe-", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"key": key, "sections": report.sections}, f, default=str)
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
    except OSError as exc:
        log.info("the hardware probe report could not be kept at %s (%s): the next start probes again", path,
                 exc.strerror or exc)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read(4096).strip()
    except OSError:
        return ""


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _source_digest() -> str:
    digest = hashlib.sha256()
    for source in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()
