"""Where finished traces go: JSON files under ``<state_dir>/traces/``, written on a thread of their own.

The files are Triton's: a JSON list of traces, kept valid after every write (each trace is appended
before the closing bracket). With ``log_frequency`` N > 0 a new file is started every N traces
(``trace.json.0``, ``trace.json.1``... as Triton names them); with 0 everything goes to one file. The
files together stay under ``max_bytes`` of disk, counted in the filesystem's blocks a file occupies (a
trace of 400 bytes alone in its file takes a whole 4 KiB block), and under ``max_files`` files: the
oldest numbered files are removed, and a single file that reached the bound takes no more traces (the
dropped ones are counted and logged). Without a writable
directory (a read-only state dir, or writes that started failing) the newest traces are kept in memory
only, bounded.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["TraceWriter"]

log = logging.getLogger(__name__)

_STOP = object()
_BLOCK = 4096
"""The block size assumed where the filesystem does not say."""


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
        self._files: deque[tuple[Path, int]] = deque()  # the files written, oldest first, with their sizes
        self._index = 0
        self._in_file = 0
        self._frequency: int | None = None
        self._thread: threading.Thread | None = None

    @property
    def path(self) -> Path | None:
        """The trace file (the base name of the numbered ones), as the settings report it."""
        return self.directory / self.file_name if self.directory is not None else None

    def add(self, trace: dict[str, Any], log_frequency: int = 0) -> None:
        """Queue one finished trace (never blocks); the writer thread starts on the first one."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trace-writer", daemon=True)
            self._thread.start()
        self._queue.put((trace, log_frequency))

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
            pattern = re.compile(re.escape(self.file_name) + r"(\.[0-9]+)?")
            for path in self.directory.iterdir():
                if pattern.fullmatch(path.name):
                    path.unlink()
        except OSError as exc:
            self._fail(exc)

    def _write(self, trace: dict[str, Any], log_frequency: int) -> None:
        if self.directory is None:
            self._memory.append(trace)
            return
        data = json.dumps(trace).encode()
        try:
            self._append(data, log_frequency)
        except OSError as exc:
            self._fail(exc)
            self._memory.append(trace)

    def _append(self, data: bytes, log_frequency: int) -> None:
        assert self.directory is not None
        if log_frequency != self._frequency:  # a changed frequency starts a new file
            self._frequency = log_frequency
            self._in_file = 0
            if self._files:
                self._index += 1
        if log_frequency > 0 and self._in_file >= log_frequency:
            self._index += 1
            self._in_file = 0
        name = f"{self.file_name}.{self._index}" if log_frequency > 0 else self.file_name
        path = self.directory / name
        fresh = self._in_file == 0
        added = len(data) + 2  # "[" and "]" around a new file's first trace, ",\n" before another one
        if fresh:  # a file name used again (log_frequency changed back) is overwritten
            self._files = deque((p, size) for p, size in self._files if p != path)
        current = 0 if fresh else self._files[-1][1]
        # What the files take on disk once this trace is in: the other files, and this one grown.
        others = sum(self._on_disk(size) for p, size in self._files if p != path)
        grown = self._on_disk(current + added)
        while self._files and self._files[0][0] != path and (
                others + grown > self.max_bytes or len(self._files) + fresh > self.max_files):
            old, size = self._files.popleft()
            old.unlink(missing_ok=True)
            others -= self._on_disk(size)
        if others + grown > self.max_bytes:
            self.dropped += 1
            if self.dropped == 1:
                log.warning("trace file %s reached trace_max_bytes (%d bytes on disk); further traces are dropped: "
                            "set log_frequency > 0 to rotate files, or raise trace_max_bytes", path, self.max_bytes)
            return
        if fresh:
            with open(path, "wb") as out:
                out.write(b"[" + data + b"]")
            self._files.append((path, added))
        else:
            with open(path, "r+b") as out:
                out.seek(-1, 2)
                out.write(b",\n" + data + b"]")
            last, size = self._files[-1]
            self._files[-1] = (last, size + added)
        self._in_file += 1

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
