"""Where finished traces go: JSON files, written on a thread of their own.

The files are Triton's: a JSON list of traces, kept valid after every write (each trace is appended
before the closing bracket). Traces come in streams, one per settings scope (the global settings, or
a model's own; see ``trace_settings``), and go where Triton's TraceManager puts them: a stream with
``log_frequency`` 0 and no ``trace_count`` appends to the trace file itself; a stream with
``log_frequency`` N > 0 fills numbered files of N traces each, and a stream counted by ``trace_count``
fills a numbered file that is closed when its count runs out (``trace.json.0``, ``trace.json.1``...,
numbered in the order they are started, one sequence per trace file). The files together stay under
``max_bytes`` of disk, counted in the filesystem's blocks a file occupies (a trace of 400 bytes alone in
its file takes a whole 4 KiB block), and under ``max_files`` files: the oldest files are removed (one
still being written is started afresh when its next trace comes), and a single file that reached the
bound takes no more traces (the dropped ones are counted and logged). Without a writable directory (a
read-only state dir, or writes that started failing) the newest traces are kept in memory only, bounded.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import re
import threading
from collections import deque
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

__all__ = ["TraceWriter"]

log = logging.getLogger(__name__)

_STOP = object()
_BLOCK = 4096
"""The block size assumed where the filesystem does not say."""
_MAX_STREAMS = 1024
"""Numbered files kept open for streams at once; the oldest stream's file ends beyond it."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Route:
    """Where a trace goes: its stream and that stream's file rules."""

    stream: Hashable
    log_frequency: int
    counted: bool
    last: bool

    @property
    def numbered(self) -> bool:
        return self.log_frequency > 0 or self.counted


class TraceWriter:
    def __init__(self, directory: Path | None, file_name: str = "trace.json", max_bytes: int = 64 * 1024**2,
                 memory_traces: int = 1000, on_error: Callable[[str], None] | None = None,
                 max_files: int = 1000) -> None:
        """``directory`` None: keep traces in memory only; ``on_error(reason)``: told once when writing
        files fails (then traces are kept in memory only)."""
        self.directory = directory
        self.file_name = file_name
        self.max_bytes = max_bytes
        self.max_files = max_files
        self._block = _BLOCK
        self.dropped = 0
        """Traces not written because a single trace file had reached ``max_bytes``."""
        self._memory: deque[dict[str, Any]] = deque(maxlen=memory_traces)
        self._on_error = on_error
        self._queue: queue.Queue[Any] = queue.Queue()
        self._files: dict[Path, int] = {}  # the files written, oldest first, with their sizes
        self._index = 0  # the next numbered file's number
        self._chunks: dict[Hashable, list[int]] = {}  # per stream: its open numbered file's [number, traces]
        self._thread: threading.Thread | None = None

    @property
    def path(self) -> Path | None:
        """The trace file (the base name of the numbered ones), as the settings report it."""
        return self.directory / self.file_name if self.directory is not None else None

    def add(self, trace: dict[str, Any], log_frequency: int = 0, *, stream: Hashable = None, counted: bool = False,
            last: bool = False) -> None:
        """Queue one finished trace (never blocks); the writer thread starts on the first one.

        ``stream``: the scope the trace was sampled in; ``log_frequency``: its traces per numbered file
        (0: none); ``counted``: the scope is limited by trace_count, so its traces go to a numbered file;
        ``last``: the scope's count ran out with this trace, which closes that file."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trace-writer", daemon=True)
            self._thread.start()
        self._queue.put((trace, _Route(stream, log_frequency, counted, last)))

    def flush(self) -> None:
        """Wait until every queued trace is written (blocks: call off the event loop)."""
        if self._thread is not None:
            self._queue.join()

    def close(self) -> None:
        """Write what is queued and stop the thread (blocks: call off the event loop)."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None

    def kept(self) -> list[dict[str, Any]]:
        """The newest traces kept in memory (when no file can be written)."""
        return list(self._memory)

    # -- the writer thread -------------------------------------------------------------------

    def _run(self) -> None:
        if self.directory is not None:
            self._prepare()
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                self._write(*item)
            finally:
                self._queue.task_done()

    def _prepare(self) -> None:
        """Make the directory and remove the trace files of an earlier run (Triton overwrites its file)."""
        assert self.directory is not None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._block = os.statvfs(self.directory).f_bsize or _BLOCK
            pattern = re.compile(r"\.?" + re.escape(self.file_name) + r"(\.[0-9]+)?(\.partial)?")
            for path in self.directory.iterdir():
                if pattern.fullmatch(path.name):
                    path.unlink()
        except OSError as exc:
            self._fail(exc)

    def _write(self, trace: dict[str, Any], route: _Route) -> None:
        if self.directory is None:
            self._memory.append(trace)
            return
        data = json.dumps(trace).encode()
        try:
            self._append(data, self._target(route))
        except OSError as exc:
            self._fail(exc)
            self._memory.append(trace)
        self._advance(route)

    def _target(self, route: _Route) -> Path:
        """The file this stream's next trace goes to."""
        assert self.directory is not None
        if not route.numbered:
            return self.directory / self.file_name
        chunk = self._chunks.get(route.stream)
        if chunk is None:
            chunk = self._chunks[route.stream] = [self._index, 0]
            self._index += 1
            while len(self._chunks) > _MAX_STREAMS:  # streams of scopes replaced long ago: their files end
                del self._chunks[next(iter(self._chunks))]
        return self.directory / f"{self.file_name}.{chunk[0]}"

    def _advance(self, route: _Route) -> None:
        """Count the trace in its stream's numbered file; close the file when it is full or the last."""
        chunk = self._chunks.get(route.stream) if route.numbered else None
        if chunk is None:
            return
        chunk[1] += 1
        if route.last or (route.log_frequency > 0 and chunk[1] >= route.log_frequency):
            del self._chunks[route.stream]

    def _append(self, data: bytes, path: Path) -> None:
        fresh = path not in self._files  # never written, or removed to stay under the bound
        added = len(data) + 2  # "[" and "]" around a new file's first trace, ",\n" before another one
        current = self._files.get(path, 0)
        # What the files take on disk once this trace is in: the other files, and this one grown.
        others = sum(self._on_disk(size) for p, size in self._files.items() if p != path)
        grown = self._on_disk(current + added)
        while any(p != path for p in self._files) and (
                others + grown > self.max_bytes or len(self._files) + fresh > self.max_files):
            old = next(p for p in self._files if p != path)
            old.unlink(missing_ok=True)
            others -= self._on_disk(self._files.pop(old))
        if others + grown > self.max_bytes:
            self.dropped += 1
            if self.dropped == 1:
                log.warning("trace file %s reached trace_max_bytes (%d bytes on disk); further traces are dropped: "
                            "set log_frequency > 0 to rotate files, or raise trace_max_bytes", path, self.max_bytes)
            return
        if fresh:  # whole or not at all: a reader never finds the file empty
            partial = path.with_name(f".{path.name}.partial")
            with open(partial, "wb") as out:
                out.write(b"[" + data + b"]")
            os.replace(partial, path)
            self._files[path] = added
        else:
            with open(path, "r+b") as out:
                out.seek(-1, 2)
                out.write(b",\n" + data + b"]")
            self._files[path] = current + added

    def _on_disk(self, size: int) -> int:
        """The bytes a file of ``size`` bytes occupies: whole blocks, at least one."""
        return max(1, -(-size // self._block)) * self._block

    def _fail(self, exc: OSError) -> None:
        if self.directory is None:
            return
        reason = f"cannot write trace files in {self.directory}: {exc}"
        log.warning("%s; traces are kept in memory only", reason)
        self.directory = None
        if self._on_error is not None:
            self._on_error(reason)
