"""A loopback load generator: wrk with a fixed request body, bounded in time, parsed into numbers."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["Result", "require_wrk", "run_wrk"]

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


@dataclasses.dataclass(frozen=True)
class Result:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int


def require_wrk() -> str:
    path = shutil.which("wrk")
    if path is None:
        raise SystemExit("the benchmark needs wrk on PATH: apt-get install wrk (make bench does this)")
    return path


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if not match:
        raise ValueError(f"cannot parse wrk latency {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def run_wrk(url: str, body: bytes, headers: dict[str, str], concurrency: int, seconds: float) -> Result:
    if not url.startswith("http://127.0.0.1:"):
        raise ValueError("load is only ever sent to 127.0.0.1")
    with tempfile.TemporaryDirectory() as tmp:
        body_path = Path(tmp) / "body"
        body_path.write_bytes(body)
        script = Path(tmp) / "post.lua"
        lines = ['wrk.method = "POST"']
        lines += [f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items()]
        lines += [f'local f = io.open("{body_path}", "rb")', "wrk.body = f:read(\"*a\")", "f:close()"]
        script.write_text("\n".join(lines) + "\n")
        output = subprocess.run(
            [require_wrk(), "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--latency", "-s", str(script),
             url],
            capture_output=True, text=True, timeout=seconds + 30, check=True,
        ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))
    p50 = _ms(re.search(r"\s50%\s+(\S+)", output).group(1))
    p99 = _ms(re.search(r"\s99%\s+(\S+)", output).group(1))
    errors = 0
    for pattern in (r"Non-2xx or 3xx responses:\s+(\d+)",
                    r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)"):
        match = re.search(pattern, output)
        if match:
            errors += sum(int(g) for g in match.groups())
    return Result(rps, p50, p99, errors)
