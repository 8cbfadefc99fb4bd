"""NVIDIA's perf_analyzer run against any server, its CSV read into numbers."""

from __future__ import annotations

import csv
import io
import re
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.oracle.install import TritonInstall, TritonUnavailable, install

__all__ = ["PerfResult", "PerfRow", "parse_csv", "run_perf_analyzer"]


@dataclass(frozen=True)
class PerfRow:
    """One line of perf_analyzer's CSV (one concurrency or request rate); latencies in microseconds."""

    values: dict[str, float]

    @property
    def concurrency(self) -> float:
        return self.values.get("Concurrency", self.values.get("Request Rate", 0.0))

    @property
    def throughput(self) -> float:
        """Inferences per second."""
        return self.values["Inferences/Second"]

    def percentile(self, p: int) -> float:
        """p50/p90/p95/p99 client latency, µs."""
        return self.values[f"p{p} latency"]

    @property
    def p50_us(self) -> float:
        return self.percentile(50)


@dataclass(frozen=True)
class PerfResult:
    rows: list[PerfRow]
    stdout: str
    command: list[str] = field(default_factory=list)

    @property
    def best(self) -> PerfRow:
        """The row with the highest throughput."""
        return max(self.rows, key=lambda row: row.throughput)


def run_perf_analyzer(args: Sequence[str], *, timeout: float = 300, triton: TritonInstall | None = None) -> PerfResult:
    """Run ``perf_analyzer *args`` (``-m``, ``-u``, ``-i grpc``, ``--concurrency-range``...) and parse it.

    A CSV file is asked for with ``-f`` unless ``args`` already names one. Raises TritonUnavailable when
    perf_analyzer cannot be installed or run, or fails (its output's tail is in the message).
    """
    triton = triton or install()
    arguments = list(args)
    with tempfile.TemporaryDirectory(prefix="perf-analyzer-") as scratch:
        if "-f" not in arguments:
            arguments += ["-f", str(Path(scratch) / "result.csv")]
        csv_path = Path(arguments[arguments.index("-f") + 1])
        command = [str(triton.perf_analyzer), *arguments]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                  env=triton.perf_environment(), stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as error:
            raise TritonUnavailable(f"perf_analyzer ran past {timeout:.0f} s: {' '.join(arguments)}") from error
        except OSError as error:
            raise TritonUnavailable(f"perf_analyzer could not start: {error}") from error
        output = done.stdout + done.stderr
        if done.returncode != 0:
            tail = "\n".join(output.strip().splitlines()[-8:])
            raise TritonUnavailable(f"perf_analyzer exited with {done.returncode}: {tail}")
        try:
            rows = parse_csv(csv_path.read_text())
        except OSError as error:
            raise TritonUnavailable(f"perf_analyzer wrote no CSV ({error}); its output: {output[-500:]}") from error
    if not rows:
        raise TritonUnavailable(f"perf_analyzer's CSV held no measurement; its output: {output[-500:]}")
    return PerfResult(rows, output, command)


def parse_csv(text: str) -> list[PerfRow]:
    """The measurement rows of perf_analyzer's ``-f`` CSV (the header names the columns; rows come in its order,
    which is not always by concurrency)."""
    # With --collect-metrics a second table follows after a blank line; the first is the measurements.
    table = re.split(r"\n\s*\n", text.strip(), maxsplit=1)[0]
    rows: list[PerfRow] = []
    for record in csv.DictReader(io.StringIO(table)):
        values: dict[str, float] = {}
        for key, value in record.items():
            try:
                values[key.strip()] = float(value)
            except (TypeError, ValueError):
                continue
        if "Inferences/Second" in values:
            rows.append(PerfRow(values))
    return rows
