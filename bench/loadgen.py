"""Loopback load generators with a fixed request body, bounded in time, parsed into numbers: wrk for
HTTP/1.1, h2load (nghttp2) for gRPC, which is HTTP/2 POSTs of one length-prefixed protobuf message."""

from __future__ import annotations

import argparse
import dataclasses
import re
import shutil
import statistics
import struct
import subprocess
import tempfile
from pathlib import Path

__all__ = ["Result", "add_wrk_arguments", "grpc_frame", "require_h2load", "require_wrk", "run_h2load", "run_wrk"]

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


@dataclasses.dataclass(frozen=True)
class Result:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    requests: int = 0
    """Requests completed (wrk's count; 0 where the generator does not say)."""


def add_wrk_arguments(parser: argparse.ArgumentParser, concurrency: tuple[int, ...] = (1, 16)) -> None:
    """The options of a benchmark made of interleaved wrk runs: --seconds, --repeats, --concurrency."""
    parser.add_argument("--seconds", type=float, default=4.0, help="duration of each wrk run")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats; medians are reported")
    parser.add_argument("--concurrency", type=lambda t: [int(c) for c in t.split(",")], default=list(concurrency))


def require_wrk() -> str:
    path = shutil.which("wrk")
    if path is None:
        raise SystemExit("the benchmark needs wrk on PATH: apt-get install wrk (make bench does this)")
    return path


def require_h2load() -> str:
    path = shutil.which("h2load")
    if path is None:
        raise SystemExit("the gRPC series need h2load on PATH: apt-get install nghttp2-client (make bench does this)")
    return path


def grpc_frame(message: bytes) -> bytes:
    """One uncompressed gRPC message on the wire: a zero flag byte and the big-endian length."""
    return b"\0" + struct.pack(">I", len(message)) + message


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if not match:
        raise ValueError(f"cannot parse wrk latency {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def run_wrk(url: str, body: bytes, headers: dict[str, str], concurrency: int, seconds: float,
            lua: str = "", prefix: tuple[str, ...] = ()) -> Result:
    """POST ``body`` for ``seconds`` over ``concurrency`` connections; ``lua``: more of wrk's script, run
    after ``wrk.body`` is set (a ``request`` function that varies the body, for instance); ``prefix`` wraps
    the command (``taskset -c ...``)."""
    if not url.startswith("http://127.0.0.1:"):
        raise ValueError("load is only ever sent to 127.0.0.1")
    with tempfile.TemporaryDirectory() as tmp:
        body_path = Path(tmp) / "body"
        body_path.write_bytes(body)
        script = Path(tmp) / "post.lua"
        lines = ['wrk.method = "POST"']
        lines += [f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items()]
        lines += [f'local f = io.open("{body_path}", "rb")', "wrk.body = f:read(\"*a\")", "f:close()", lua]
        script.write_text("\n".join(lines) + "\n")
        output = subprocess.run(
            [*prefix, require_wrk(), "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--latency", "-s",
             str(script), url],
            capture_output=True, text=True, timeout=seconds + 30, check=True,
        ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))
    count = re.search(r"(\d+) requests in ", output)
    completed = int(count.group(1)) if count else 0
    p50 = _ms(re.search(r"\s50%\s+(\S+)", output).group(1))
    p99 = _ms(re.search(r"\s99%\s+(\S+)", output).group(1))
    errors = 0
    for pattern in (r"Non-2xx or 3xx responses:\s+(\d+)",
                    r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)"):
        match = re.search(pattern, output)
        if match:
            errors += sum(int(g) for g in match.groups())
    return Result(rps, p50, p99, errors, completed)


def run_h2load(url: str, body: bytes, concurrency: int, seconds: float,
               prefix: tuple[str, ...] = ()) -> tuple[Result, int]:
    """POST ``body`` (a gRPC frame) over ``concurrency`` HTTP/2 connections with one call in flight each
    (as wrk's connections); ``prefix`` wraps the command (``taskset -c ...``). Returns the result and the
    number of calls completed: gRPC reports errors in trailers, which h2load does not read, so the caller
    counts failures from the server's statistics (``Result.errors`` holds transport failures only)."""
    if not url.startswith("http://127.0.0.1:"):
        raise ValueError("load is only ever sent to 127.0.0.1")
    with tempfile.TemporaryDirectory() as tmp:
        body_path, log_path = Path(tmp) / "body", Path(tmp) / "log"
        body_path.write_bytes(body)
        output = subprocess.run(
            [*prefix, require_h2load(), "-n0", f"-D{max(1, round(seconds))}", f"-c{concurrency}", "-m1", "-t1",
             "-d", str(body_path), "-H", "content-type: application/grpc", "-H", "te: trailers",
             f"--log-file={log_path}", url],
            capture_output=True, text=True, timeout=seconds + 30, check=True,
        ).stdout
        durations = sorted(int(line.split("\t")[2]) / 1000 for line in log_path.read_text().splitlines()
                           if line.count("\t") == 2)
    finished = re.search(r"finished in ([\d.]+)(ms|s), ([\d.]+) req/s", output)
    counts = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                       r"(\d+) errored, (\d+) timeout", output)
    if not finished or not counts or not durations:
        raise RuntimeError(f"cannot parse h2load's output:\n{output}")
    done = int(counts.group(1))
    p99 = durations[min(len(durations) - 1, int(len(durations) * 0.99))]
    result = Result(float(finished.group(3)), statistics.median(durations), p99,
                    sum(int(counts.group(i)) for i in (3, 4, 5)))
    return result, done
