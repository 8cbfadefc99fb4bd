"""Instructions per request under callgrind: the appliance against the lean reference (and a baseline
checkout), a figure the box's load barely moves.

    python -m bench.instructions [--requests 500] [--warm-up 200] [--repeats 3] [--baseline CHECKOUT]
                                 [--varied-bodies | --binary] [--concurrency 1]

CPU time per request on this project's shared 2-vCPU boxes moves by ±5 % within a run and ±20 % between
runs, which hides a change worth 1–3 %. Valgrind's callgrind counts the instructions each process runs
in user space, whatever else the box does. It leaves out the kernel (system calls, context switches) and
the time a cache miss costs, so it says what the Python costs, not everything a request costs: the CPU
benchmarks (bench.lean) stay the targets' judges. The daemon's periodic work is driven by the clock, not
by requests, and valgrind stretches the run some fifty times (more on a loaded box): counted with the
requests, the metrics tick made runs of one tree differ by up to 5 %. So the appliance counted here ticks
once an hour (``metrics_interval``; what a request does to the statistics and the metrics' counters is
counted as ever), and runs of one tree agree within 0.3 % (the reference's within 0.1 %). ``--repeats``
runs of each server, alternated, and the median; an A/B compares within one run.

Each server runs under ``valgrind --tool=callgrind --instr-atstart=no --trace-children=yes`` (its model
processes too), on bench.lean's setup (bench/triton_models.py's Python identity, the token required; the
appliance as a production box ships it). After ``--warm-up`` requests, instrumentation is switched on in
every process of the tree (``callgrind_control -i on``), ``--requests`` requests go one after another
over one keep-alive connection (v2 JSON, bench.lean's body; ``--varied-bodies``: its six lengths in
turn; ``--binary``: Triton's binary tensor extension as tritonclient and perf_analyzer send it, each
request with other tensor bytes under the same JSON header and its output asked for as binary data), and
each process's counts are dumped: instructions per request, the server process and the processes below
it. The reference speaks v2 JSON only, so ``--binary`` counts the appliance (and the baseline) alone. A
server starts in about a minute under valgrind. ``--concurrency N`` sends the requests N at a time, one on each
of N connections, each round's answers read after all N are sent: the server finds them together and
batches them (the identity model's max_batch_size is 8), as under a load generator's c=N; the appliance's
mean batch size (its statistics) is printed with each run. Writes bench/results/instructions.md
(instructions-varied.md, instructions-binary.md; with ``--concurrency N``, ``-cN`` before the ``.md``).
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.lean import _MODEL, _TOKEN, VARIED, _body, lean_setup
from bench.process import Server, start_appliance, start_lean_reference
from bench.report import command_line, commit, machine, publish
from bench.serving import RESULTS
from bench.triton import process_tree

__all__ = ["BINARY", "Count", "Sender", "count_dumps", "main", "median_count", "quiet_setup", "table"]

_CALLGRIND = ("valgrind", "--tool=callgrind", "--instr-atstart=no", "--trace-children=yes")
_DUMP = re.compile(r"\.(\d+)\.(\d+)$")
"""A dump's file name ends in its process's pid and the dump's number (the file at exit has none)."""
_SUMMARY = re.compile(rb"^(?:summary|totals):\s+(\d+)", re.M)


@dataclasses.dataclass(frozen=True)
class Count:
    """Instructions per request of one server's tree."""

    server: float
    """Of the server process itself."""
    below: float
    """Of the processes below it (its model processes)."""
    batch: float | None = None
    """The mean batch size over the counted requests, where the server keeps statistics (the appliance)."""

    @property
    def total(self) -> float:
        return self.server + self.below


def count_dumps(directory: Path, server_pid: int, requests: int) -> Count:
    """The instructions per request the dumps in ``directory`` counted (``cg.<pid>.<n>`` files; the files
    written at exit are left out), split between ``server_pid`` and the other processes."""
    server = below = 0
    for path in directory.iterdir():
        match = _DUMP.search(path.name)
        if not path.name.startswith("cg.") or match is None:
            continue
        summary = _SUMMARY.search(path.read_bytes())
        if summary is None:
            raise ValueError(f"{path} holds no callgrind summary: is it a callgrind dump?")
        if int(match.group(1)) == server_pid:
            server += int(summary.group(1))
        else:
            below += int(summary.group(1))
    return Count(server / requests, below / requests)


def _served(port: int) -> tuple[int, int] | None:
    """The identity model's (inferences, executions) from Triton's statistics endpoint; None where the
    server has none (the reference)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request("GET", f"/v2/models/{_MODEL}/stats", headers={"Authorization": f"Bearer {_TOKEN}"})
        answer = connection.getresponse()
        body = answer.read()
    finally:
        connection.close()
    if answer.status != 200:
        return None
    stats = json.loads(body)["model_stats"]
    return sum(int(s["inference_count"]) for s in stats), sum(int(s["execution_count"]) for s in stats)


def median_count(counts: list[Count]) -> Count:
    """The run whose total is the median (the lower of the middle two for an even number)."""
    ranked = sorted(counts, key=lambda count: count.total)
    return ranked[(len(ranked) - 1) // 2]


def table(counts: dict[str, Count], reference: str = "reference") -> str:
    """One row per server: instructions per request (server process + the processes below), and the
    ratio of the total to ``reference``'s."""
    base = counts.get(reference)
    lines = ["| server | instructions per request (server + model process) | × " + reference + " |", "|---|---|---|"]
    for name, count in counts.items():
        ratio = "" if base is None or name == reference else f"{count.total / base.total:.3f}"
        lines.append(f"| {name} | {count.total / 1000:,.1f} k ({count.server / 1000:,.1f} k + "
                     f"{count.below / 1000:,.1f} k) | {ratio} |")
    return "\n".join(lines)


def _control(pids: list[int], *args: str) -> None:
    """``callgrind_control`` with ``args`` for each process (one that has exited meanwhile is passed over)."""
    for pid in pids:
        subprocess.run(["callgrind_control", *args, str(pid)], capture_output=True, timeout=120, check=False)


BINARY = tuple(b'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"FP32","parameters":{"binary_data_size":64}}],'
               b'"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]}'
               + struct.pack("<16f", *(value * step for value in range(16))) for step in range(1, 7))
"""``--binary``: one JSON header (as tritonclient writes it), six sets of tensor bytes under it."""


def binary_header_length(body: bytes) -> int:
    """Where a ``BINARY`` body's JSON header ends."""
    return len(body) - 64


class Sender:
    """Inferences over keep-alive connections to ``port``: bench.lean's identity (or ``model``, which takes
    the same tensors) with the token, ``bodies`` in turn (a ``BINARY`` one with its header length).
    ``concurrency`` connections: each round sends one request on every connection before it reads the
    answers, so the server finds them together (as a load generator's c=N keeps N in flight) and may batch
    them."""

    def __init__(self, port: int, bodies: tuple[bytes, ...], concurrency: int = 1, model: str = _MODEL) -> None:
        self._connections = [http.client.HTTPConnection("127.0.0.1", port, timeout=120) for _ in range(concurrency)]
        self._bodies = bodies
        self._sent = 0
        self._path = f"/v2/models/{model}/infer"

    def send(self, count: int) -> None:
        """``count`` requests, in rounds of one a connection (``count`` is a multiple of ``concurrency``)."""
        if count % len(self._connections):
            raise ValueError(f"{count} requests do not make whole rounds of {len(self._connections)}")
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {_TOKEN}"}
        for _ in range(count // len(self._connections)):
            for connection in self._connections:
                body = self._bodies[self._sent % len(self._bodies)]
                self._sent += 1
                extra = {}
                if body in BINARY:
                    extra = {"Content-Type": "application/octet-stream",
                             "Inference-Header-Content-Length": str(binary_header_length(body))}
                connection.request("POST", self._path, body=body, headers={**headers, **extra})
            for connection in self._connections:
                answer = connection.getresponse()
                answer.read()
                if answer.status != 200:
                    raise RuntimeError(f"the server answered {answer.status} to an inference")

    def close(self) -> None:
        for connection in self._connections:
            connection.close()


def measure(server: Server, dumps: Path, requests: int, warm_up: int, bodies: tuple[bytes, ...],
            concurrency: int = 1) -> Count:
    """Instructions per request of ``server``'s tree, started under callgrind writing into ``dumps``
    (``requests`` and ``warm_up``: multiples of ``concurrency``)."""
    sender = Sender(server.port, bodies, concurrency)
    try:
        sender.send(warm_up)
        before = _served(server.port)
        pids = [pid for pid, _, _ in process_tree(server.process.pid)]
        _control(pids, "-i", "on")
        sender.send(requests)
        _control(pids, "-d")
        after = _served(server.port)
    finally:
        sender.close()
    count = count_dumps(dumps, server.process.pid, requests)
    if before is None or after is None or after[1] == before[1]:
        return count
    return dataclasses.replace(count, batch=(after[0] - before[0]) / (after[1] - before[1]))


QUIET_METRICS = "metrics_interval = 3600\n"
"""What the appliance's settings gain here: its metrics tick, driven by the clock, once an hour (module
docstring)."""


def quiet_setup(work: Path, models: tuple[str, ...] = (_MODEL,)) -> tuple[Path, dict[str, str]]:
    """bench.lean's setup (``lean_setup``, of ``models``), the appliance's metrics tick once an hour."""
    repo, env = lean_setup(work, models)
    settings = Path(env["APPLIANCE_CONFIG"])
    settings.write_text(settings.read_text() + QUIET_METRICS)
    return repo, env


def _servers(work: Path, baseline: Path | None, reference: bool = True) -> dict[str, Callable[[Path], Server]]:
    """How to start each server under callgrind, its dumps written into the directory it is given
    (``reference``: the lean reference too)."""
    repo, env = quiet_setup(work)

    def wrap(dumps: Path) -> tuple[str, ...]:
        return (*_CALLGRIND, f"--callgrind-out-file={dumps / 'cg.%p'}")

    servers: dict[str, Callable[[Path], Server]] = {
        "reference": lambda dumps: start_lean_reference(repo / _MODEL, dumps / "reference.log", "--token", _TOKEN,
                                                        prefix=wrap(dumps)),
        "appliance": lambda dumps: start_appliance(repo, dumps / "state", env=env, prefix=wrap(dumps)),
    }
    if not reference:
        del servers["reference"]
    if baseline is not None:
        servers["baseline"] = lambda dumps: start_appliance(repo, dumps / "state", env=env, prefix=wrap(dumps),
                                                            tree=baseline)
    return servers


_BODIES = {(False, False): "v2 JSON", (True, False): "v2 JSON, six body lengths in turn",
           (False, True): "binary tensors under one JSON header, the output asked for as binary data"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=500, help="requests counted, one after another")
    parser.add_argument("--warm-up", type=int, default=200, help="requests sent before counting starts")
    parser.add_argument("--baseline", type=Path, help="also count the appliance from this checkout (an A/B)")
    bodies = parser.add_mutually_exclusive_group()
    bodies.add_argument("--varied-bodies", action="store_true", help="bench.lean's six bodies in turn")
    bodies.add_argument("--binary", action="store_true",
                        help="binary tensors under one JSON header (the appliance and the baseline only)")
    parser.add_argument("--concurrency", type=int, default=1,
                        help="requests in flight together, on as many connections (rounds of one each; "
                             "the counts are rounded up to whole rounds): writes instructions-c<N>.md")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each server, alternated; the median of each server's totals is given")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.requests < 1 or args.warm_up < 0 or args.repeats < 1 or args.concurrency < 1:
        parser.error("--requests, --repeats and --concurrency must be at least 1, --warm-up at least 0")
    args.requests = -(-args.requests // args.concurrency) * args.concurrency
    args.warm_up = -(-args.warm_up // args.concurrency) * args.concurrency
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            print(f"{tool} is not installed: apt-get install valgrind", file=sys.stderr)
            return 1
    started = time.monotonic()
    bodies = VARIED if args.varied_bodies else BINARY if args.binary else (_body(),)
    runs: dict[str, list[Count]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as tmp:
        servers = _servers(Path(tmp), args.baseline, reference=not args.binary)
        for repeat in range(args.repeats):
            for name, start in servers.items():
                dumps = Path(tmp) / f"{name}-{repeat}"
                dumps.mkdir()
                server = start(dumps)
                try:
                    count = measure(server, dumps, args.requests, args.warm_up, bodies, args.concurrency)
                finally:
                    server.stop()
                runs.setdefault(name, []).append(count)
                batch = "" if count.batch is None else f" (mean batch {count.batch:.2f})"
                print(f"  repeat {repeat + 1}/{args.repeats} {name}: {count.total / 1000:,.1f} k instructions a "
                      f"request{batch}", file=sys.stderr, flush=True)
    counts = {name: median_count(counted) for name, counted in runs.items()}
    text = (f"Command: {command_line('bench.instructions', argv)} ({time.monotonic() - started:.0f} s), commit "
            f"{commit()}, {time.strftime('%Y-%m-%d')}\n\nMachine: {machine()}. Callgrind's count of the "
            f"instructions each process runs in user space (the kernel left out), over {args.requests} requests "
            + (f"sent one after another after {args.warm_up} uncounted" if args.concurrency == 1 else
               f"sent {args.concurrency} at a time on {args.concurrency} connections after {args.warm_up} uncounted")
            + f" (bench.lean's setup: Python identity FP32[16], "
            f"{_BODIES[(args.varied_bodies, args.binary)]}, the token required; the appliance's metrics tick "
            f"once an hour); the median of {args.repeats} "
            f"runs of each server, alternated (every run's total: "
            + "; ".join(f"{name} " + ", ".join(f"{c.total / 1000:,.1f} k"
                                               + ("" if c.batch is None else f" (mean batch {c.batch:.2f})")
                                               for c in counted)
                        for name, counted in runs.items())
            + ").\n\n" + table(counts, reference="reference" if not args.binary else "baseline"))
    name = "instructions-varied" if args.varied_bodies else "instructions-binary" if args.binary else "instructions"
    name = f"{name}-c{args.concurrency}.md" if args.concurrency > 1 else f"{name}.md"
    publish(text, args.out, name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
