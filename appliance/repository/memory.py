"""What a model takes in memory: the estimate before a load, the measurement after it, the book that keeps
measurements across restarts (in the state dir), and the kernel's memory-pressure signal.

Blocking functions (files, /proc, psutil): call them off the event loop.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path

import psutil
from tritonclient.grpc import model_config_pb2 as mc

__all__ = ["MIB", "Estimate", "MemoryBook", "Pressure", "declared", "estimate_from_files", "process_rss",
           "read_pressure"]

MIB = 1024 * 1024
log = logging.getLogger(__name__)

# What a backend holds beyond its model files, and how much its files grow once loaded, on a first load
# (corrected by the measurement after it). A Python model's files say nothing of what initialize()
# allocates: its figure is a model process (interpreter and numpy) with room for its arrays; a config
# parameter memory_mib tells better.
_BASE_AND_FACTOR: dict[str, tuple[int, float]] = {
    "python": (256 * MIB, 1.0),
    "onnxruntime": (32 * MIB, 2.0),
    "openvino": (64 * MIB, 2.0),
    "pytorch": (256 * MIB, 1.5),
    "tensorrt": (128 * MIB, 1.2),
}
_DEFAULT = (32 * MIB, 2.0)
_PLATFORMS = {"onnxruntime_onnx": "onnxruntime", "pytorch_libtorch": "pytorch", "tensorrt_plan": "tensorrt",
              "openvino": "openvino"}
_MAX_BOOK_BYTES = 1 << 20
"""A memory book larger than this is not read (someone else wrote it): estimates start from the files."""


@dataclasses.dataclass(frozen=True, slots=True)
class Estimate:
    bytes: int
    source: str
    """Where the figure comes from, as a refusal names it: "measured at its last load", "its config's
    memory_mib", "estimated from its files"."""
    known: int | None = None
    """For a guess from the files: the part the files themselves account for (the rest is the backend's
    base, a guess); None when the whole figure is known."""


def backend_of(config: mc.ModelConfig) -> str:
    name = config.backend or _PLATFORMS.get(config.platform, config.platform)
    return "pytorch" if name in ("torchscript", "libtorch") else name


def declared(name: str, config: mc.ModelConfig) -> int | None:
    """The config's ``memory_mib`` parameter in bytes: what the model says it needs at least (memory RSS
    does not show, such as a discrete GPU's, included); None without one."""
    given = config.parameters["memory_mib"].string_value.strip() if "memory_mib" in config.parameters else ""
    if not given:
        return None
    try:
        mib = float(given)
    except ValueError:
        mib = -1.0
    if not 0 <= mib < 1 << 40:
        log.warning("model %s: parameter memory_mib %r is not a number of MiB; ignored", name, given[:40])
        return None
    return int(mib * MIB)


def estimate_from_files(path: Path, config: mc.ModelConfig) -> Estimate:
    """A first load's estimate: the config's ``memory_mib`` parameter when it has one, else the size of the
    model's files (links not followed) times its backend's factor, plus the backend's base."""
    given = declared(path.name, config)
    if given is not None:
        return Estimate(given, "its config's memory_mib")
    base, factor = _BASE_AND_FACTOR.get(backend_of(config), _DEFAULT)
    files = int(_files_size(path) * factor)
    return Estimate(base + files, "estimated from its files", known=files)


def _files_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):  # os.walk follows no links to directories
        for name in files:
            try:
                stat = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            total += stat.st_size
    return total


def process_rss(pids: Iterable[int]) -> int:
    """Resident bytes of the processes ``pids`` together (those gone are counted as nothing)."""
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return total


class MemoryBook:
    """What each model measured at its last load, kept in ``path`` (JSON, {model: bytes}); None keeps it
    in memory only (a read-only state dir). A damaged or foreign file is ignored, never trusted beyond a
    number per model."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._sizes: dict[str, int] = self._read(path) if path is not None else {}

    @staticmethod
    def _read(path: Path) -> dict[str, int]:
        try:
            with path.open("rb") as file:
                text = file.read(_MAX_BOOK_BYTES + 1)
            if len(text) > _MAX_BOOK_BYTES:
                raise ValueError(f"larger than {_MAX_BOOK_BYTES} bytes")
            data = json.loads(text)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("the model memory book %s cannot be read (%s); estimates start from the models' files",
                        path, exc)
            return {}
        if not isinstance(data, dict):
            return {}
        return {str(k): v for k, v in data.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 0}

    def get(self, name: str) -> int | None:
        with self._lock:
            return self._sizes.get(name)

    def record(self, name: str, size: int) -> None:
        """Keep ``size`` for ``name`` and write the book (blocking; a failed write is logged, not raised)."""
        with self._lock:
            self._sizes[name] = size
            if self._path is None:
                return
            text = json.dumps(self._sizes, sort_keys=True)
            temporary = self._path.with_name(self._path.name + ".tmp")
            try:
                temporary.write_text(text)
                os.replace(temporary, self._path)
            except OSError as exc:
                log.warning("cannot write the model memory book %s: %s", self._path, exc)


_AVG10 = re.compile(rb"^some avg10=([0-9.]+)", re.MULTILINE)


@dataclasses.dataclass(frozen=True, slots=True)
class Pressure:
    """One reading of the kernel's memory pressure."""

    some_avg10: float | None
    """PSI: the share (percent) of the last 10 s some task stalled on memory; None without PSI."""
    high_events: int | None
    """The cgroup's memory.events ``high`` counter (times it went over memory.high); None without one."""


def read_pressure(psi: Path = Path("/proc/pressure/memory"),
                  cgroup_root: Path = Path("/sys/fs/cgroup")) -> Pressure:
    """The kernel's memory pressure now (blocking)."""
    avg10: float | None = None
    try:
        match = _AVG10.search(psi.read_bytes()[:4096])
        avg10 = float(match.group(1)) if match else None
    except (OSError, ValueError):
        pass
    return Pressure(avg10, _high_events(cgroup_root))


def _high_events(root: Path) -> int | None:
    try:
        line = Path("/proc/self/cgroup").read_text()[:4096].splitlines()
        relative = next((entry.split(":", 2)[2] for entry in line if entry.startswith("0::")), None)
        if relative is None:
            return None
        events = (root / relative.lstrip("/") / "memory.events").read_text()[:4096]
    except (OSError, IndexError):
        return None
    for entry in events.splitlines():
        key, _, value = entry.partition(" ")
        if key == "high" and value.isdigit():
            return int(value)
    return None
