"""bench.instructions' own pieces: the dumps it counts (a dump per process, the files written at exit left
out, the server's own apart from those below it) and its table."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest

from appliance.settings import load_settings
from bench.instructions import Count, Sender, count_dumps, median_count, quiet_setup, table
from bench.lean import _MODEL, _body


def _dump(path, instructions: int) -> None:
    path.write_bytes(b"# callgrind format\nversion: 1\ncreator: callgrind-3.22.0\ncmd: python\npart: 1\n"
                     b"events: Ir\nfn=main\n0 5\nsummary: %d\ntotals: %d\n" % (instructions, instructions))


def test_the_dumps_are_split_between_the_server_and_the_processes_below_it(tmp_path):
    _dump(tmp_path / "cg.100.1", 5_000_000)
    _dump(tmp_path / "cg.200.1", 1_000_000)
    _dump(tmp_path / "cg.201.1", 500_000)
    _dump(tmp_path / "cg.100", 9_999_999)  # written at exit, after the count: left out
    (tmp_path / "reference.log").write_text("serving")
    count = count_dumps(tmp_path, 100, 500)
    assert count == Count(10_000.0, 3_000.0) and count.total == 13_000.0


def test_a_file_that_is_no_dump_is_refused(tmp_path):
    (tmp_path / "cg.100.1").write_bytes(b"not callgrind")
    with pytest.raises(ValueError, match="no callgrind summary"):
        count_dumps(tmp_path, 100, 1)


def test_the_table_gives_each_tree_against_the_reference():
    lines = table({"reference": Count(250_000, 125_000), "appliance": Count(500_000, 130_000)}).splitlines()
    assert lines[2] == "| reference | 375.0 k (250.0 k + 125.0 k) |  |"
    assert lines[3] == "| appliance | 630.0 k (500.0 k + 130.0 k) | 1.680 |"


def test_the_median_run_is_the_middle_total_and_an_even_count_takes_the_lower():
    runs = [Count(500_000, 130_000), Count(470_000, 130_000), Count(490_000, 133_000)]
    assert median_count(runs) == Count(490_000, 133_000)
    assert median_count(runs[:2]) == Count(470_000, 130_000)


def test_the_table_can_compare_against_the_baseline():
    lines = table({"appliance": Count(470_000, 134_000), "baseline": Count(547_000, 134_000)},
                  reference="baseline").splitlines()
    assert lines[0].endswith("× baseline |") and lines[2].endswith("| 0.887 |")


def test_the_appliance_counted_ticks_its_metrics_once_an_hour(tmp_path):
    repo, env = quiet_setup(tmp_path)
    settings = load_settings(env={}, config_file=Path(env["APPLIANCE_CONFIG"]))
    assert settings.metrics.interval == 3600  # clock-driven work, stretched by valgrind, not counted
    assert settings.auth.protect_inference  # bench.lean's production settings kept
    assert [model.name for model in repo.iterdir()] == [_MODEL]


def test_the_setup_serves_the_models_it_is_asked_for(tmp_path):
    repo, _ = quiet_setup(tmp_path, (_MODEL, "bls"))
    assert sorted(model.name for model in repo.iterdir()) == ["bls", _MODEL]


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers each request once ``expected`` requests are in: a round's answers must not be awaited before
    every request of it is sent."""

    protocol_version = "HTTP/1.1"
    arrived: list[int] = []
    paths: list[str] = []
    all_in = threading.Event()
    expected = 0

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).arrived.append(self.client_address[1])
        type(self).paths.append(self.path)
        if len(type(self).arrived) == type(self).expected:
            type(self).all_in.set()
        assert type(self).all_in.wait(10), "the sender waited for an answer before sending the round"
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


def test_the_sender_puts_a_round_in_flight_on_every_connection_before_reading():
    _Recorder.arrived, _Recorder.paths, _Recorder.expected = [], [], 3
    _Recorder.all_in = threading.Event()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    sender = Sender(server.server_address[1], (_body(),), concurrency=3, model="bls")
    try:
        sender.send(3)
        assert len(set(_Recorder.arrived)) == 3  # one request on each of three connections
        assert set(_Recorder.paths) == {"/v2/models/bls/infer"}
        with pytest.raises(ValueError, match="whole rounds of 3"):
            sender.send(4)
    finally:
        sender.close()
        server.shutdown()
        server.server_close()
