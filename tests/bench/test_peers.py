"""bench.peers' own pieces: each line compares the appliance with a peer's best configuration (by median
throughput) and is marked against the target; a peer that answers wrongly is refused before any load."""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bench.models import write_repository
from bench.peers import MODELS, PeerServer, Row, _expected, _spawn, best_of, check_answers, parse_args, table
from bench.process import Server
from tests.processes import running
from tests.waiting import wait_until


def _row(server: str, rate: float, cpu: float, concurrency: int = 16, errors: int = 0) -> Row:
    return Row(server, "pinned", "cnn", "http", concurrency, rate, 1.0, cpu, errors)


def test_a_peer_is_judged_by_its_best_configuration():
    rows = [_row("mlserver:in-process", 100, 900), _row("mlserver:in-process", 120, 800),
            _row("mlserver:workers=1", 140, 1200), _row("mlserver:workers=1", 150, 1100),
            _row("appliance", 130, 700), _row("appliance", 140, 650)]
    assert best_of(rows, "mlserver") == ("workers=1", 145, 1150, 0)
    assert best_of(rows, "kserve") is None
    text, met, total = table(rows, ["mlserver", "kserve"])
    line = text.splitlines()[2]
    assert line == ("| pinned | cnn | http | 16 | mlserver (workers=1) | 145 | 135 | 0.93 | 1150 | 675 | 0.59 | 0, 0 "
                    "| MISSED |")
    assert (met, total) == (0, 1)
    rows += [_row("kserve:default", 100, 2000)]
    text, met, total = table(rows, ["mlserver", "kserve"])
    assert text.splitlines()[3].endswith("| kserve (default) | 100 | 135 | 1.35 | 2000 | 675 | 0.34 | 0, 0 | met |")
    assert (met, total) == (1, 2)


def test_a_configuration_that_answered_errors_is_not_the_best_and_an_erring_appliance_misses():
    rows = [_row("litserve:default", 300, 900, errors=5), _row("litserve:batching", 100, 900),
            _row("appliance", 200, 500)]
    assert best_of(rows, "litserve") == ("batching", 100, 900, 0)
    assert best_of(rows[:1], "litserve") == ("default", 300, 900, 5)  # every configuration erred: the best of them
    text, met, _ = table(rows, ["litserve"])
    assert text.splitlines()[2].endswith("| 0, 0 | met |") and met == 1
    text, met, _ = table([*rows, _row("appliance", 200, 500, errors=1)], ["litserve"])
    assert text.splitlines()[2].endswith("| 1, 0 | MISSED |") and met == 0


def test_cases_are_lines_of_their_own():
    rows = [_row("appliance", 200, 500, 1), _row("litserve:default", 100, 900, 1),
            _row("appliance", 300, 400), _row("litserve:default", 400, 300)]
    text, met, total = table(rows, ["litserve"])
    assert [line.split(" | ")[3] for line in text.splitlines()[2:]] == ["1", "16"]
    assert (met, total) == (1, 2)


def test_unknown_peers_are_refused_with_the_choices():
    with pytest.raises(SystemExit):
        parse_args(["--peers", "mlserver,torchserve"])
    assert parse_args(["--peers", "kserve", "--concurrency", "1"]).peers == ["kserve"]


@contextlib.contextmanager
def _answering(outputs: dict[str, np.ndarray]) -> Iterator[Server]:
    """A v2 JSON server on 127.0.0.1 that answers each model with ``outputs[name]``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            value = outputs[self.path.split("/")[3]]
            body = json.dumps({"outputs": [{"name": "y", "shape": list(value.shape), "datatype": "FP32",
                                            "data": value.ravel().tolist()}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Server(process=None, port=server.server_address[1])  # type: ignore[arg-type]
    finally:
        server.shutdown()
        server.server_close()


def test_a_peer_that_answers_wrongly_is_refused_before_the_load(tmp_path: Path):
    repo = write_repository(tmp_path / "repo")
    right = {served: _expected(repo, served, tensor) for served, tensor in MODELS.values()}
    with _answering(right) as server:
        check_answers(server, "litserve:default", repo, ["http"])
    wrong = {**right, "tiny": np.zeros_like(right["tiny"])}
    with _answering(wrong) as server, pytest.raises(RuntimeError, match="answered tiny over http wrongly"):
        check_answers(server, "litserve:default", repo, ["http"])


def test_the_defaults_run_every_peer_and_case():
    args = parse_args([])
    assert isinstance(args, argparse.Namespace)
    assert (args.peers, args.models, args.protocols, args.pinning, args.concurrency) == (
        ["mlserver", "kserve", "litserve", "bentoml"], ["tiny", "cnn"], ["http", "grpc"], ["pinned", "unpinned"],
        [1, 16])


def test_stopping_a_peer_ends_the_processes_it_started(tmp_path: Path):
    """MLServer's and LitServe's workers outlive a terminated parent: the whole group goes."""
    pid_file = tmp_path / "child"
    parent = ("import subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import signal, time\\n"
              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\ntime.sleep(60)'])\n"
              f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
              "time.sleep(60)\n")
    server = PeerServer(_spawn([sys.executable, "-c", parent], tmp_path / "log"), 0)
    wait_until(lambda: pid_file.exists() and pid_file.read_text(), timeout=30)
    child = int(pid_file.read_text())
    server.stop()
    assert server.process.poll() is not None
    wait_until(lambda: not running(child), timeout=10)

