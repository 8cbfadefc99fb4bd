"""Where the CPU of one request goes, layer by layer, in the appliance and in the lean reference (issue 49):
the budget each layer of the appliance's request path may spend, and what it spends.

    python -m bench.layers [--seconds 5] [--repeats 1] [--concurrency 1,16] [--server-core 0] [--load-core 1]

The servers, model, pinning and load are bench.lean's (both servers up, measured in turn). During each wrk
run py-spy samples the server and its model process (``--subprocesses --nonblocking``, 250 Hz, the
samples where a thread runs); each sample goes to the layer of its innermost frame that names one
(``classify``): HTTP framing, decode, routing and admission, scheduling, the hop on the server's side,
the hop on the model process's side (all of that process but the model), execution (the model's own
``model.py``), encode, statistics, and the event loop (uvloop, asyncio, the system calls under them,
and any frame no layer names). gRPC's own HTTP/2 transport is HTTP framing, its codec decode and encode,
the rest of ``appliance/grpc`` routing and admission (bench.bytecodes classifies gRPC requests by them).
A layer's µs per request is its share of the samples times the tree's CPU per request from /proc.

Budgets: the appliance may spend 1.5× the reference's CPU per request (bench.lean's target), shared out
as 1.25× the reference's own cost for each layer both have, and an eighth of the reference's total each
for scheduling and statistics, which the reference does without; the budgets add up to the target. py-spy
must be on PATH or beside the interpreter (pip install py-spy) with ptrace rights over the servers.
Writes bench/results/layers.md.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.lean import SERVERS, TARGET, measure, start_servers
from bench.loadgen import add_wrk_arguments, require_wrk
from bench.profile import _py_spy, _record
from bench.report import heading, publish
from bench.serving import RESULTS

__all__ = ["LAYERS", "budgets", "classify", "layer_shares", "main"]

LAYERS = ("HTTP framing", "decode", "routing and admission", "scheduling", "hop, server side",
          "hop, model side", "execution", "encode", "statistics", "event loop")
_APPLIANCE_ONLY = ("scheduling", "statistics")
_SHARED_FACTOR = 1.25
_ONLY_SHARE = (TARGET - _SHARED_FACTOR) / len(_APPLIANCE_ONLY)
"""Of the reference's total, what each layer the reference does without may spend."""
_RATE_HZ = 250

_ENCODE = {"encode_answer", "encode_infer_response", "encoding_work", "_json_data", "json_numbers", "_json_array",
           "_numbers_text", "_raw_bytes", "_binary_choice", "_binary_choice.<locals>.binary", "non_finite_token",
           "output_text", "encode", "encode_in_pieces", "plain_answer", "binary_answer", "_binary_answer",
           "_in_pieces"}
# (layer, file prefix or name, functions: None for all): the first rule that matches a frame names its layer.
_GRPC_ENCODE = {"serialize_infer_response", "serialize_stream_response", "encode_infer_response", "encoding_work",
                "_message_pieces", "_head_bytes", "_plain_head", "_bare_head", "_head", "_described", "_raw", "_varint"}
_RULES: tuple[tuple[str, str, frozenset[str] | None], ...] = (
    ("encode", "appliance/rest/codec.py", frozenset(_ENCODE)),
    ("encode", "appliance/grpc/codec.py", frozenset(_GRPC_ENCODE)),
    ("decode", "appliance/grpc/codec.py", None),
    ("decode", "appliance/grpc/known_message.py", None),
    ("HTTP framing", "appliance/grpc/http2/", None),  # gRPC's own HTTP/2 transport
    ("routing and admission", "appliance/grpc/", None),
    ("encode", "bench/lean_reference.py", frozenset({"encode"})),
    ("decode", "appliance/rest/codec.py", None),
    ("decode", "appliance/rest/infer_body.py", None),
    ("decode", "appliance/engine/tensor_checks.py", None),
    ("decode", "appliance/engine/validation.py", None),
    ("decode", "appliance/core/tensors.py", None),
    ("decode", "bench/lean_reference.py", frozenset({"decode", "_decode_input", "_check_shape"})),
    ("statistics", "appliance/engine/stats.py", None),
    ("statistics", "appliance/engine/traffic.py", None),
    ("statistics", "appliance/metrics/", None),
    ("scheduling", "appliance/engine/scheduler/", None),
    ("scheduling", "appliance/engine/instances.py", None),
    ("scheduling", "appliance/engine/model.py", None),
    ("hop, server side", "appliance/backends/", None),
    ("hop, server side", "bench/lean_model.py", None),  # its framing, called by the server's side of the hop
    ("hop, server side", "bench/lean_reference.py",
     frozenset({"_Hop.send", "_Hop._flush", "_Hop.received", "_HopReader.data_received"})),
    ("routing and admission", "appliance/protocol/", None),
    ("routing and admission", "appliance/rest/lane.py", None),
    ("routing and admission", "appliance/rest/security.py", None),
    ("routing and admission", "appliance/rest/browser.py", None),
    ("routing and admission", "appliance/security/", None),
    ("routing and admission", "appliance/repository/", None),
    ("routing and admission", "bench/lean_reference.py", frozenset({"_Server.dispatch", "_Server._infer",
                                                                     "answer", "_error"})),
    ("event loop", "bench/lean_reference.py", frozenset({"main", "_serve"})),
    ("HTTP framing", "appliance/rest/", None),
    ("HTTP framing", "bench/lean_reference.py", None),
)
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def classify(process: str, frames: list[str]) -> str:
    """The layer of one sample: ``process`` is py-spy's label of its process, ``frames`` its stack from the
    root. A model process's samples are the model's (execution) or the hop's model side."""
    parsed = [(m.group("function"), m.group("file")) for m in map(_FRAME.match, frames) if m]
    if "model_process" in process or "bench.lean_model" in process:
        ours = ("appliance/", "bench/")
        model = any(Path(file).name == "model.py" and not file.startswith(ours) for _, file in parsed)
        return "execution" if model else "hop, model side"
    for function, file in reversed(parsed):
        for layer, where, functions in _RULES:
            if (file.startswith(where) or file.endswith("/" + where)) and (functions is None or function in functions):
                return layer
    return "event loop"


def layer_shares(raw: str) -> dict[str, float]:
    """The share of the samples of py-spy's raw output (collapsed stacks) in each layer."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        processes = 0  # a child's stacks sit below its parent's label: the last label is the process's
        while processes < len(frames) and frames[processes].startswith("process "):
            processes += 1
        counts[classify(frames[max(processes - 1, 0)], frames[processes:])] += int(count)
    total = sum(counts.values())
    return {layer: counts[layer] / total if total else 0.0 for layer in LAYERS}


def budgets(reference: dict[str, float]) -> dict[str, float]:
    """Each layer's budget in µs per request from the reference's costs (see the module's docstring)."""
    total = sum(reference.values())
    return {layer: total * _ONLY_SHARE if layer in _APPLIANCE_ONLY else reference[layer] * _SHARED_FACTOR
            for layer in LAYERS}


def table(costs: dict[tuple[str, int], dict[str, float]]) -> str:
    concurrencies = sorted({c for _, c in costs})
    head = " | ".join(f"c={c}: reference, appliance, budget µs, verdict" for c in concurrencies)
    lines = [f"| layer | {head} |", "|---|" + "---|" * len(concurrencies)]
    plans = {c: budgets(costs[("reference", c)]) for c in concurrencies}
    for layer in (*LAYERS, "total"):
        cells = []
        for c in concurrencies:
            mine, reference = costs[("appliance", c)], costs[("reference", c)]
            if layer == "total":
                got, base, budget = sum(mine.values()), sum(reference.values()), sum(plans[c].values())
            else:
                got, base, budget = mine[layer], reference[layer], plans[c][layer]
            cells.append(f"{base:.0f}, {got:.0f}, {budget:.0f}, {'met' if got <= budget else 'MISSED'}")
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_wrk_arguments(parser)
    parser.set_defaults(repeats=1)
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--load-core", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    require_wrk()
    py_spy = _py_spy()
    started, before = time.monotonic(), os.getloadavg()[0]
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-layers-") as tmp:
        servers = start_servers(Path(tmp), args.server_core)
        try:
            for server in servers.values():
                measure(server, 16, 2.0, args.load_core)  # warm-up
            for repeat in range(args.repeats):
                for concurrency in args.concurrency:
                    for name in SERVERS if repeat % 2 == 0 else tuple(reversed(SERVERS)):
                        raw = Path(tmp) / f"{name}-{concurrency}-{repeat}.txt"
                        record = argparse.Namespace(seconds=round(args.seconds), native=False, gil=False, raw=True)
                        result = _record(py_spy, servers[name].process.pid, record, raw,
                                         lambda name=name, c=concurrency: measure(servers[name], c, args.seconds,
                                                                                  args.load_core))
                        shares = layer_shares(raw.read_text())
                        runs.setdefault((name, concurrency), []).append(
                            {layer: share * result.cpu_us for layer, share in shares.items()})
                        loads.append(result.load)
                        print(f"  {name:9} c={concurrency:<3} {result.requests_per_s:8.0f} req/s  "
                              f"{result.cpu_us:5.0f} µs CPU/req  load {result.load:.2f}", file=sys.stderr, flush=True)
        finally:
            for server in servers.values():
                server.stop()
    costs = {key: {layer: statistics.median(run[layer] for run in rows) for layer in LAYERS}
             for key, rows in runs.items()}
    text = (heading("bench.layers", argv, started, before, loads) + " bench.lean's servers and load (pinned, token "
            f"required, v2 JSON, Python identity); py-spy at {_RATE_HZ} Hz shares each tree's /proc CPU per request "
            f"out to the layers; medians of {args.repeats} repeat(s). Budget: 1.25× the reference's layer, "
            "scheduling and statistics ⅛ of the reference's total each (together 1.5× the reference).\n\n"
            + table(costs))
    publish(text, args.out, "layers.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
