"""The real-Triton harness itself: install, serve on loopback only, perf_analyzer's numbers, reasons."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.oracle import TritonServer, TritonUnavailable, install, parse_csv, run_perf_analyzer
from tests.oracle.models import IDENTITY, IDENTITY_CONFIG, write_python_model

_CSV = """Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,\
Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency
1,2867.17,51,143,14,12,95,29,0,303,387,467,1426
2,4100.5,50,150,20,12,95,29,0,480,520,600,1500
"""


def test_parse_csv_reads_every_measurement_row():
    rows = parse_csv(_CSV)
    assert [row.concurrency for row in rows] == [1, 2]
    assert rows[0].throughput == pytest.approx(2867.17)
    assert rows[1].p50_us == 480 and rows[1].percentile(99) == 1500


def test_parse_csv_stops_at_the_metrics_table():
    assert len(parse_csv(_CSV + "\nModel,GPU UUID,Utilisation\nidentity,none,0\n")) == 2


def test_an_unwritable_cache_is_a_reason_not_a_crash(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(TritonUnavailable, match="cannot create the Triton cache"):
        install(blocker / "sub" / "triton")


def test_a_missing_repository_is_a_reason(triton_install, tmp_path: Path):
    with pytest.raises(TritonUnavailable, match="does not exist"):
        TritonServer(tmp_path / "nowhere", triton=triton_install).start()


def test_triton_serves_on_loopback_and_perf_analyzer_measures_it(triton_install, tmp_path: Path):
    repository = tmp_path / "repo"
    write_python_model(repository, "identity", IDENTITY, IDENTITY_CONFIG)
    with TritonServer(repository, triton=triton_install, log_path=tmp_path / "triton.log") as triton:
        request = urllib.request.Request(
            f"{triton.base}/v2/models/identity/infer", method="POST",
            data=json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3],
                                         "data": [1, 2, 3]}]}).encode())
        answer = json.load(urllib.request.urlopen(request, timeout=10))
        # numpy<2 reached the stub: with numpy 2 the output arrives empty.
        assert answer["outputs"][0]["data"] == [1.0, 2.0, 3.0]

        server = psutil.Process(triton.pid)
        listening = [c.laddr for c in server.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
        assert {address.port for address in listening} == {triton.http_port, triton.grpc_port}
        assert all(address.ip in ("127.0.0.1", "::ffff:127.0.0.1") for address in listening), listening
        stubs = server.children(recursive=True)
        assert stubs, "the Python model runs in a stub process, a child of the server"

        for protocol, url in (("http", triton.http_url), ("grpc", triton.grpc_url)):
            result = run_perf_analyzer(["-m", "identity", "-u", url, "-i", protocol, "--shape", "INPUT0:16",
                                        "--measurement-mode", "count_windows", "--measurement-request-count", "50",
                                        "--stability-percentage", "1000", "--concurrency-range", "1:2"],
                                       triton=triton_install, timeout=120)
            assert sorted(row.concurrency for row in result.rows) == [1, 2]
            assert all(row.throughput > 0 and row.p50_us > 0 for row in result.rows)
    assert not any(stub.is_running() and stub.status() != psutil.STATUS_ZOMBIE for stub in stubs)


def test_perf_analyzer_failure_carries_its_output(triton_install):
    with pytest.raises(TritonUnavailable, match="perf_analyzer exited"):
        run_perf_analyzer(["-m", "identity", "-u", "127.0.0.1:1", "--measurement-interval", "100"],
                          triton=triton_install, timeout=60)
