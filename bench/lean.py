"""The appliance against the lean reference (bench.lean_reference), side by side in one run (issue 49).

    python -m bench.lean [--seconds 5] [--repeats 3] [--concurrency 1,16] [--server-core 0] [--load-core 1]
                         [--varied-bodies]

Both serve the same model, bench/triton_models.py's Python identity (FP32[16], max_batch_size 8, one
instance), each with its model process: the appliance as a production box ships it (the default plan, a
process per Python model instance; the bearer token required for inference with no network exempt,
connection and memory limits, statistics and metrics history at their defaults; gRPC on; only mDNS and the
separate metrics port off), the reference with the same token. Each server and every process below it
is pinned with ``taskset`` to one core, ``wrk -t1`` to the other; both run the whole time and each round
measures one then the other (the order flips every repeat) at each concurrency, with v2 JSON POSTs. CPU
per request is each whole process tree's, from /proc around each wrk run, split into the server process
(all its threads) and the processes below it (the model process), over the requests wrk completed. The
table gives medians over the repeats; the ratio is the median of each round's appliance/reference CPU.
Target: the appliance's CPU per request ≤ 1.5× the reference's at every concurrency. Writes
bench/results/lean.md. ``--varied-bodies`` sends the request written six ways in turn, each body of its own
length (a client whose data changes: each head differs from the last in its Content-Length), and writes
bench/results/lean-varied.md. ``--triton`` measures real Triton 2.51 (tests/oracle) on the same model in the
same rounds, pinned the same way (every thread of its server and of its Python stub), with the same requests
(it takes no token: the header goes unread): its row gives each server's CPU over Triton's, to tell which of
bench.triton's targets the reference itself meets on this box.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bench.loadgen import add_wrk_arguments, require_wrk, run_wrk
from bench.process import Server, start_appliance, start_lean_reference
from bench.report import heading, publish
from bench.serving import RESULTS
from bench.triton import TICKS_PER_SECOND, process_tree
from bench.triton_models import write_repository

if TYPE_CHECKING:
    from tests.oracle import TritonServer

__all__ = ["Round", "lean_setup", "main", "measure", "start_servers", "table", "tree_split"]

TARGET = 1.5
"""The appliance's CPU per request over the reference's, at most."""
SERVERS = ("appliance", "reference")
"""The two servers every run compares (bench.layers too), in the table's order."""
TRITON = "triton"
"""The third server, with ``--triton``: last in the table."""
_MODEL = "identity"
_TOKEN = "lean-bench-token-0123456789abcdef"
_WARM_UP_S = 2.0


@dataclasses.dataclass(frozen=True)
class Round:
    """One wrk run against one server."""

    requests_per_s: float
    p50_ms: float
    server_us: float
    """CPU of the server process (all its threads) per request."""
    model_us: float
    """CPU of the processes below it (its model process) per request."""
    errors: int
    load: float

    @property
    def cpu_us(self) -> float:
        return self.server_us + self.model_us


def tree_split(pid: int) -> tuple[float, float]:
    """CPU seconds of ``pid`` itself (with what its reaped children left) and of the processes below it."""
    own = below = 0
    for process, fields, _ in process_tree(pid):
        try:
            ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
        except (IndexError, ValueError):
            continue
        if process == pid:
            own += ticks
        else:
            below += ticks
    return own / TICKS_PER_SECOND, below / TICKS_PER_SECOND


def _affinities(pid: int) -> set[str]:
    """The CPU lists of every process below ``pid`` (itself included)."""
    found = set()
    for process, _, _ in process_tree(pid):
        try:
            for line in Path(f"/proc/{process}/status").read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    found.add(line.split(":", 1)[1].strip())
        except OSError:
            continue
    return found


def _body(decimals: int = 1) -> bytes:
    """The request: 0 to 15 as FP32, each value written with ``decimals`` decimals."""
    data = ", ".join(f"{v:.{decimals}f}" for v in range(16))
    return (b'{"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [%s]}]}'
            % data.encode())


VARIED = tuple(_body(decimals) for decimals in range(1, 7))
"""``--varied-bodies``: the same request written six ways, each of its own length, as a client whose data
changes sends them (each head then differs from the one before in its Content-Length)."""


def varied_lua() -> str:
    """wrk's ``request`` function that sends ``VARIED`` in turn."""
    bodies = ", ".join(f"[==[{body.decode()}]==]" for body in VARIED)
    return (f"local bodies = {{{bodies}}}\nlocal sent = 0\n"
            "request = function()\n  sent = sent % #bodies + 1\n  return wrk.format(nil, nil, nil, bodies[sent])\nend")


def measure(server: Server, concurrency: int, seconds: float, load_core: int, lua: str = "") -> Round:
    """One wrk run of ``seconds`` against ``server`` (wrk pinned to ``load_core``; ``lua``: its ``request``
    function, where the bodies vary), its tree's CPU around it."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {_TOKEN}"}
    own, below = tree_split(server.process.pid)
    result = run_wrk(f"{server.base}/v2/models/{_MODEL}/infer", _body(), headers, concurrency, seconds, lua=lua,
                     prefix=("taskset", "-c", str(load_core)))
    own_after, below_after = tree_split(server.process.pid)
    per = 1e6 / result.requests if result.requests else float("nan")
    return Round(result.requests_per_s, result.p50_ms, (own_after - own) * per, (below_after - below) * per,
                 result.errors, os.getloadavg()[0])


def _ratio(mine: list[Round], other: list[Round]) -> float:
    """The median of each round's CPU per request over ``other``'s in the same repeat."""
    return statistics.median(a.cpu_us / b.cpu_us for a, b in zip(mine, other))


def table(rounds: dict[tuple[str, int], list[Round]]) -> str:
    """One row per concurrency and server (medians over its rounds); on the appliance's row the median of
    each round's CPU ratio over the reference, marked against ``TARGET``; where Triton was measured, each
    server's CPU over Triton's too (bench.triton's target: ≤ 1.0×)."""
    triton = any(name == TRITON for name, _ in rounds)
    lines = ["| c | server | req/s | p50 ms | CPU µs/req (server + model process) | × reference CPU | "
             f"target ≤ {TARGET}× |{' × Triton CPU |' if triton else ''} errors | load |",
             f"|---|---|---|---|---|---|---|{'---|' if triton else ''}---|---|"]
    for concurrency in sorted({c for _, c in rounds}):
        reference = rounds.get(("reference", concurrency), [])
        against = rounds.get((TRITON, concurrency), [])
        for name in (*SERVERS, TRITON):
            mine = rounds.get((name, concurrency))
            if not mine:
                continue
            server, model = statistics.median(r.server_us for r in mine), statistics.median(r.model_us for r in mine)
            ratio_cell, verdict = "", ""
            if name == "appliance" and reference:
                ratio = _ratio(mine, reference)
                ratio_cell, verdict = f"{ratio:.2f}", "met" if ratio <= TARGET else "MISSED"
            triton_cell = ""
            if triton:
                triton_cell = f" {_ratio(mine, against):.2f} |" if against and name != TRITON else " |"
            lines.append(f"| {concurrency} | {name} | {statistics.median(r.requests_per_s for r in mine):.0f} | "
                         f"{statistics.median(r.p50_ms for r in mine):.3f} | "
                         f"{statistics.median(r.cpu_us for r in mine):.0f} ({server:.0f} + {model:.0f}) | "
                         f"{ratio_cell} | {verdict} |{triton_cell} {sum(r.errors for r in mine)} | "
                         f"{statistics.median(r.load for r in mine):.2f} |")
    return "\n".join(lines)


def lean_setup(work: Path, models: tuple[str, ...] = (_MODEL,)) -> tuple[Path, dict[str, str]]:
    """The repository both servers serve (bench.triton_models' ``models``, the identity model alone by
    default, under ``work``) and the environment that makes the appliance require the token as the
    reference does (a settings file under ``work``)."""
    every = write_repository(work / "all")
    repo = work / "repo"
    for model in models:
        shutil.copytree(every / model, repo / model)
    settings = work / "appliance.toml"
    settings.write_text(f'auth_token = "{_TOKEN}"\nauth_exempt_networks = []\nprotect_inference = true\n')
    return repo, {"APPLIANCE_CONFIG": str(settings)}


def start_servers(work: Path, server_core: int, triton: bool = False) -> dict[str, Server]:
    """The appliance and the reference on the identity model (``lean_setup``), both pinned to
    ``server_core``, both requiring the token: by name, as in ``SERVERS``. With ``triton``, real Triton
    too, pinned there once it is ready."""
    repo, env = lean_setup(work)
    pin = ("taskset", "-c", str(server_core))
    servers = {"appliance": start_appliance(repo, work / "state", env=env, prefix=pin)}
    try:
        servers["reference"] = start_lean_reference(repo / _MODEL, work / "reference.log", "--token", _TOKEN,
                                                    prefix=pin)
        for name, server in servers.items():
            _check_token_required(name, server)
        if triton:
            servers[TRITON] = _start_triton(repo, work / "triton.log", server_core)
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers


@dataclasses.dataclass
class _Triton(Server):
    """Real Triton as bench.lean measures a server: its process (its stubs below it) and its HTTP port."""

    oracle: TritonServer | None = None

    def stop(self) -> None:
        assert self.oracle is not None
        self.oracle.stop()


def _start_triton(repo: Path, log: Path, core: int) -> Server:
    """tritonserver (tests/oracle) on ``repo``, every thread of it and of its stubs pinned to ``core``."""
    from tests.oracle import TritonServer

    oracle = TritonServer(repo, log_path=log).start()
    try:
        for pid, _, _ in process_tree(oracle.pid):
            subprocess.run(["taskset", "-a", "-p", "-c", str(core), str(pid)], check=True, capture_output=True,
                           timeout=30)
    except BaseException:
        oracle.stop()
        raise
    assert oracle.process is not None
    return _Triton(oracle.process, oracle.http_port, oracle.grpc_port, oracle)


def _check_token_required(name: str, server: Server) -> None:
    """Both servers are measured with the token checked: an inference without it must be refused."""
    request = urllib.request.Request(f"{server.base}/v2/models/{_MODEL}/infer", data=_body(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            status = answer.status
    except urllib.error.HTTPError as error:
        status = error.code
    if status != 401:
        raise RuntimeError(f"{name} answered {status} to an inference without the token; expected 401")


def run(args: argparse.Namespace) -> tuple[dict[tuple[str, int], list[Round]], list[str]]:
    """Every round; and what was seen of the pinning."""
    rounds: dict[tuple[str, int], list[Round]] = {}
    notes = []
    with tempfile.TemporaryDirectory(prefix="bench-lean-") as tmp:
        servers = start_servers(Path(tmp), args.server_core, args.triton)
        try:
            for name, server in servers.items():
                pinned = _affinities(server.process.pid)
                notes.append(f"{name}: cores {', '.join(sorted(pinned))}")
                measure(server, 16, _WARM_UP_S, args.load_core)  # warm-up: first requests pay for lazy set-up
            lua = varied_lua() if args.varied_bodies else ""
            names = tuple(servers)
            for repeat in range(args.repeats):
                order: Sequence[str] = names if repeat % 2 == 0 else tuple(reversed(names))
                for concurrency in args.concurrency:
                    for name in order:
                        result = measure(servers[name], concurrency, args.seconds, args.load_core, lua)
                        rounds.setdefault((name, concurrency), []).append(result)
                        print(f"  repeat {repeat + 1}/{args.repeats} {name:9} c={concurrency:<3} "
                              f"{result.requests_per_s:8.0f} req/s  p50 {result.p50_ms:6.3f} ms  "
                              f"{result.cpu_us:5.0f} µs CPU/req ({result.server_us:.0f} + {result.model_us:.0f})  "
                              f"errors {result.errors}  load {result.load:.2f}", file=sys.stderr, flush=True)
        finally:
            for server in servers.values():
                server.stop()
    return rounds, notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_wrk_arguments(parser)
    parser.add_argument("--server-core", type=int, default=0, help="the core both servers are pinned to")
    parser.add_argument("--load-core", type=int, default=1, help="the core wrk is pinned to")
    parser.add_argument("--varied-bodies", action="store_true",
                        help="send the request written six ways, each of its own length, in turn (as a client "
                             "whose data changes): writes lean-varied.md")
    parser.add_argument("--triton", action="store_true",
                        help="measure real Triton 2.51 (tests/oracle) in the same rounds, pinned the same way: "
                             "writes lean-triton.md (lean-varied-triton.md)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    usable = os.sched_getaffinity(0)
    if args.server_core == args.load_core or not {args.server_core, args.load_core} <= usable:
        parser.error(f"--server-core and --load-core must be two different cores of {sorted(usable)}")
    require_wrk()
    started, before = time.monotonic(), os.getloadavg()[0]
    rounds, notes = run(args)
    loads = [r.load for runs in rounds.values() for r in runs]
    text = (heading("bench.lean", argv, started, before, loads) + f" Servers pinned to core {args.server_core} "
            f"({'; '.join(notes)}), wrk -t1 to core {args.load_core}; Python identity FP32[16], v2 JSON"
            f"{' written six ways in turn (bodies of six lengths)' if args.varied_bodies else ''}, "
            f"{args.seconds:g} s per run; medians of {args.repeats} repeats, servers alternated. CPU per request "
            "of each whole process tree (the server process and its model process"
            f"{'; Triton: tritonserver and its Python stub' if args.triton else ''}).\n\n" + table(rounds))
    name = "lean-varied" if args.varied_bodies else "lean"
    publish(text, args.out, f"{name}-triton.md" if args.triton else f"{name}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
