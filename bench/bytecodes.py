"""Bytecodes per request on the daemon's event loop, by layer and by function: which code a request runs.

    python -m bench.bytecodes [--requests 300] [--warm-up 100] [--body json|binary|grpc]
                              [--model identity|bls|pipeline|accumulate]
                              [--baseline CHECKOUT] [--reference] [--concurrency 1] [--top 30]

bench.layers shares the CPU a request costs out to the layers by sampling, which the box's noise moves;
bench.instructions counts what a request costs, whatever the load, but not where. This counts where: the
daemon runs under a tracer (``bench/bytecode_daemon.py``: ``sys.settrace`` with ``f_trace_opcodes`` on its
main thread, the event loop's), and over ``--requests`` requests sent one after another (bench.lean's
identity model and token; v2 JSON, Triton's binary tensors as tritonclient and perf_analyzer send them, or a
gRPC ModelInfer by tritonclient) every bytecode and every Python call is counted by the function it ran in.
Each function's count goes to its layer by bench.layers' rules (the function's own file, not its callers').
The count is exact and repeatable to a few bytecodes (a read that brings half a request makes another
call); bytecodes are not all alike (a call, a dict made, or a C function such as a regex or protobuf parse
costs many instructions as one), so bench.instructions stays the judge of what a change saves. With
``--baseline`` the same for another checkout, side by side; with ``--reference`` (v2 JSON only) the lean
reference's server (bench.lean_reference, its functions in layers by bench.layers' rules for it), which
says how much Python the same request needs at least. ``--concurrency N`` sends the HTTP requests N at a
time (as bench.instructions does): what a request costs once batches and groups share the per-batch work.
``--model`` sends the requests to another of bench.triton's models: ``bls`` calls the identity with
``InferenceRequest.exec()`` once a request (the daemon's part of the call, read from the calling model
process, run through the identity and answered, is counted with the request's); ``pipeline`` is the
ensemble of two Python steps; ``accumulate`` takes sequences (v2 JSON or gRPC: 20 steps each, the first
with its start flag, the last with its end flag, as perf_analyzer's ``--sequence-length 20`` sends them).
The model processes and the daemon's other threads are not traced. Writes
bench/results/bytecodes-<body>.md (``-<model>`` for a model other than the identity, ``-cN`` and
``-reference`` before the ``.md`` with those options).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from bench.instructions import BINARY, Sender, quiet_setup
from bench.layers import LAYERS, classify
from bench.lean import _MODEL, _TOKEN, _body
from bench.process import Server, start_appliance, start_lean_reference
from bench.report import command_line, commit, machine, publish
from bench.serving import RESULTS

__all__ = ["Counted", "by_layer", "main", "sequence_bodies", "table", "top_functions"]

_DAEMON = Path(__file__).resolve().parent / "bytecode_daemon.py"
_MODELS = {_MODEL: "bench.lean's identity model",
           "bls": "bench.triton_models' bls, calling the identity once a request",
           "pipeline": "bench.triton_models' ensemble of two Python identities",
           "accumulate": "bench.triton_models' accumulate, sequences of 20 steps"}
_SERVED = {_MODEL: (_MODEL,), "bls": ("bls", _MODEL), "pipeline": ("pipeline", "step_a", "step_b"),
           "accumulate": ("accumulate",)}
"""The models each ``--model`` needs in the repository."""
SEQUENCE_LENGTH = 20


def sequence_bodies(length: int = SEQUENCE_LENGTH, sequence_id: int = 7) -> tuple[bytes, ...]:
    """One sequence of ``length`` v2 JSON steps to ``accumulate`` (INT32 [1, 1]), the first with its start
    flag and the last with its end flag: sent in turn, the sequence starts again after its end."""
    bodies = []
    for step in range(length):
        flags = {"sequence_id": sequence_id, "sequence_start": step == 0, "sequence_end": step == length - 1}
        bodies.append(json.dumps({"parameters": flags, "inputs": [
            {"name": "INPUT0", "shape": [1, 1], "datatype": "INT32", "data": [step]}]}).encode())
    return tuple(bodies)
_SETTLE_S = 1.0
"""How long a signal to the traced daemon is given to take effect (it runs between two of its bytecodes)."""


@dataclasses.dataclass(frozen=True)
class Counted:
    """One function's counts over the measured requests."""

    file: str
    line: int
    function: str
    bytecodes: int
    calls: int

    @property
    def layer(self) -> str:
        """bench.layers' layer of this function (its rules name files as py-spy does: from the package)."""
        return classify("appliance", [f"{self.function} ({_short(self.file)}:{self.line})"])


def by_layer(counted: Iterable[Counted], requests: int) -> dict[str, tuple[float, float]]:
    """Bytecodes and calls per request in each of bench.layers' layers (every layer, zeros included)."""
    totals = {layer: [0, 0] for layer in LAYERS}
    for entry in counted:
        totals[entry.layer][0] += entry.bytecodes
        totals[entry.layer][1] += entry.calls
    return {layer: (bytecodes / requests, calls / requests) for layer, (bytecodes, calls) in totals.items()}


def top_functions(counted: Iterable[Counted], requests: int, top: int) -> list[tuple[str, float, float]]:
    """The ``top`` functions by bytecodes per request: (where, bytecodes, calls) per request."""
    ranked = sorted(counted, key=lambda entry: (-entry.bytecodes, entry.file, entry.line))[:top]
    return [(f"{_short(entry.file)}:{entry.line} {entry.function}", entry.bytecodes / requests,
             entry.calls / requests) for entry in ranked]


def _short(file: str) -> str:
    for root in ("appliance/", "bench/"):
        at = file.rfind("/" + root)
        if at >= 0:
            return file[at + 1:]
    return Path(file).name


def table(layers: dict[str, dict[str, tuple[float, float]]]) -> str:
    """One column per tree (``layers``: each tree's ``by_layer``), the first against each other one."""
    names = list(layers)
    head = " | ".join(f"{name}: bytecodes (calls)" for name in names)
    ratios = names[1:]
    lines = [f"| layer | {head} |" + "".join(f" {names[0]} × {name} |" for name in ratios),
             "|---|" + "---|" * (len(names) + len(ratios))]
    totals = {name: (sum(b for b, _ in rows.values()), sum(c for _, c in rows.values()))
              for name, rows in layers.items()}
    for layer in (*LAYERS, "total"):
        cells = [totals[name] if layer == "total" else layers[name][layer] for name in names]
        text = " | ".join(f"{bytecodes:,.0f} ({calls:.1f})" for bytecodes, calls in cells)
        ratio = "".join(f" {cells[0][0] / cell[0]:.3f} |" if cell[0] else " - |" for cell in cells[1:])
        lines.append(f"| {layer} | {text} |{ratio}")
    return "\n".join(lines)


def _grpc_sender(server: Server, model: str) -> tuple[Callable[[int], None], Callable[[], None]]:
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    sequence = model == "accumulate"
    data = np.zeros((1, 1), np.int32) if sequence else np.arange(16, dtype=np.float32).reshape(1, 16)
    sent = 0

    def send(count: int) -> None:
        nonlocal sent
        for _ in range(count):
            tensor = grpcclient.InferInput("INPUT0", list(data.shape), "INT32" if sequence else "FP32")
            tensor.set_data_from_numpy(data)
            step = sent % SEQUENCE_LENGTH
            flags = ({"sequence_id": 7, "sequence_start": step == 0, "sequence_end": step == SEQUENCE_LENGTH - 1}
                     if sequence else {})
            client.infer(model, [tensor], outputs=[grpcclient.InferRequestedOutput("OUTPUT0")],
                         headers={"authorization": f"Bearer {_TOKEN}"}, **flags)
            sent += 1

    return send, client.close


def measure(server: Server, out: Path, body: str, requests: int, warm_up: int, concurrency: int = 1,
            model: str = _MODEL) -> list[Counted]:
    """The counts of ``server`` (started with the tracer, writing to ``out``) over ``requests`` requests to
    ``model`` (``concurrency`` at a time over HTTP: bench.instructions' Sender)."""
    if body == "grpc":
        send, close = _grpc_sender(server, model)
    else:
        bodies = BINARY if body == "binary" else sequence_bodies() if model == "accumulate" else (_body(),)
        sender = Sender(server.port, bodies, concurrency, model)
        send, close = sender.send, sender.close
    try:
        send(warm_up)
        os.kill(server.process.pid, signal.SIGUSR1)
        time.sleep(_SETTLE_S)
        send(requests)
        os.kill(server.process.pid, signal.SIGUSR2)
        deadline = time.monotonic() + 60
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(_SETTLE_S)  # (written in one go, but give it the time to finish)
    finally:
        close()
    return [Counted(*row) for row in json.loads(out.read_text())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--warm-up", type=int, default=100)
    parser.add_argument("--body", choices=("json", "binary", "grpc"), default="json")
    parser.add_argument("--model", choices=tuple(_MODELS), default=_MODEL,
                        help="the model called: the identity, the BLS model that calls it once a request, the "
                             "ensemble of two identities, or sequences")
    parser.add_argument("--baseline", type=Path, help="also count this checkout's daemon (an A/B)")
    parser.add_argument("--concurrency", type=int, default=1,
                        help="HTTP requests in flight together, on as many connections (rounds of one each, as "
                             "bench.instructions sends them): the per-request code of batches and groups")
    parser.add_argument("--reference", action="store_true",
                        help="also count the lean reference's server (v2 JSON only)")
    parser.add_argument("--top", type=int, default=30, help="functions listed, by bytecodes")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.requests < 1 or args.warm_up < 1:
        parser.error("--requests and --warm-up must be at least 1 (the warm-up makes the plans a client repeats)")
    if args.concurrency < 1 or (args.concurrency > 1 and args.body == "grpc"):
        parser.error("--concurrency is at least 1, and more than 1 only over HTTP (--body json or binary)")
    if args.model == "accumulate" and (args.body == "binary" or args.concurrency > 1):
        parser.error("--model accumulate sends one sequence's steps in order, in v2 JSON or over gRPC: --body "
                     "json or grpc, --concurrency 1")
    args.requests = -(-args.requests // args.concurrency) * args.concurrency
    args.warm_up = -(-args.warm_up // args.concurrency) * args.concurrency
    if args.reference and (args.body != "json" or args.model != _MODEL):
        parser.error("the lean reference serves the identity over v2 JSON only: --reference takes --body json "
                     "and the identity model")
    started = time.monotonic()
    trees: dict[str, Path | None] = {"appliance": None}
    if args.baseline is not None:
        trees["baseline"] = args.baseline
    if args.reference:
        trees["reference"] = None
    layers: dict[str, dict[str, tuple[float, float]]] = {}
    tops: dict[str, list[tuple[str, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-bytecodes-") as tmp:
        repo, env = quiet_setup(Path(tmp), _SERVED[args.model])
        for name, tree in trees.items():
            out = Path(tmp) / f"{name}.json"
            traced = (sys.executable, str(_DAEMON))
            if name == "reference":
                server = start_lean_reference(repo / _MODEL, Path(tmp) / "reference.log", "--token", _TOKEN,
                                              prefix=traced, env={"BENCH_BYTECODES_OUT": str(out)})
            else:
                server = start_appliance(repo, Path(tmp) / name, tree=tree, prefix=traced,
                                         env={**env, "BENCH_BYTECODES_OUT": str(out)})
            try:
                counted = measure(server, out, args.body, args.requests, args.warm_up, args.concurrency,
                                  args.model)
            finally:
                server.stop()
            layers[name] = by_layer(counted, args.requests)
            tops[name] = top_functions(counted, args.requests, args.top)
            print(f"  {name}: {sum(b for b, _ in layers[name].values()):,.0f} bytecodes a request", file=sys.stderr)
    text = (f"Command: {command_line('bench.bytecodes', argv)} ({time.monotonic() - started:.0f} s), commit "
            f"{commit()}, {time.strftime('%Y-%m-%d')}\n\nMachine: {machine()}. Bytecodes (and Python calls) a "
            f"request on the daemon's event loop, over {args.requests} {args.body} requests sent "
            f"{'one after another' if args.concurrency == 1 else f'{args.concurrency} at a time'} "
            f"after {args.warm_up} uncounted ({_MODELS[args.model]} and bench.lean's token; the metrics tick once an "
            "hour), "
            "each function's counted in its own file's layer (bench.layers' rules).\n\n" + table(layers))
    for name, rows in tops.items():
        text += (f"\n\nThe {args.top} functions of {name} that run the most bytecodes a request:\n\n"
                 "| function | bytecodes | calls |\n|---|---|---|\n"
                 + "\n".join(f"| {where} | {bytecodes:.1f} | {calls:.2f} |" for where, bytecodes, calls in rows))
    suffix = (("" if args.model == _MODEL else f"-{args.model}")
              + (f"-c{args.concurrency}" if args.concurrency > 1 else "") + ("-reference" if args.reference else ""))
    publish(text, args.out, f"bytecodes-{args.body}{suffix}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
