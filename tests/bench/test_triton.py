"""bench.triton's own pieces: the CPU and memory it reads cover every process below a server (model processes are
started from a thread, so they are that thread's children, not the main thread's), and the appliance
serves the repository both servers are measured on, with the answers each model is written to give; the
tables mark each target met or missed."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from bench.process import start_appliance
from bench.triton import CASES, doubled, idle_table, table, tree_cpu_seconds, tree_rss_mib
from bench.triton_models import REPEATS, write_repository
from tests.waiting import wait_until


def test_cpu_of_a_child_started_from_another_thread_counts():
    busy = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n"
    started: list[subprocess.Popen] = []
    before = tree_cpu_seconds(os.getpid())
    thread = threading.Thread(target=lambda: started.append(subprocess.Popen([sys.executable, "-c", busy])))
    thread.start()
    thread.join()
    child = started[0]
    # Read while the child still runs (then it is counted through the thread's children list).
    with contextlib.suppress(AssertionError):  # judged just below
        wait_until(lambda: tree_cpu_seconds(os.getpid()) - before >= 0.3, timeout=30, interval=0.05)
    assert tree_cpu_seconds(os.getpid()) - before >= 0.3
    child.wait(30)


def test_the_memory_of_a_tree_counts_a_child_started_from_another_thread():
    child: list[subprocess.Popen] = []
    script = "import signal\nblock = bytearray(64 << 20)\nblock[::4096] = b'x' * len(block[::4096])\nsignal.pause()\n"
    thread = threading.Thread(target=lambda: child.append(subprocess.Popen([sys.executable, "-c", script])))
    thread.start()
    thread.join()
    try:
        wait_until(lambda: tree_rss_mib(child[0].pid)[0] >= 64, timeout=30, interval=0.05)
        mine, processes = tree_rss_mib(os.getpid())
        assert processes >= 2 and mine >= tree_rss_mib(child[0].pid)[0] + 10  # this process's own share too
    finally:
        child[0].kill()
        child[0].wait(10)


def test_the_tables_mark_every_target():
    data = {"medians": {"triton": {"identity|http|1": [1000.0, 0.5, 200.0, 1.0]},
                        "appliance": {"identity|http|1": [1100.0, 0.4, 250.0, 1.2]}},
            "idle_rss": {"triton": [300.0, 8], "appliance": [310.0, 8]}}
    row = table(data).splitlines()[-1]
    assert row.endswith("| met | met | MISSED | 1.1 |")  # 1.10× throughput, 0.80× p50, 1.25× CPU
    assert idle_table(data).splitlines()[-1] == "| appliance | 310.0 | 8 | 1.03 | MISSED |"
    data["idle_rss"]["appliance"] = [290.0, 8]
    assert idle_table(data).splitlines()[-1].endswith("| 0.97 | met |")


def test_identity_at_16_is_held_to_twice_tritons_throughput():
    identity = CASES["identity"].name
    data = {"medians": {"triton": {f"{identity}|http|16": [3000.0, 1.0, 300.0, 1.0],
                                   f"{identity}|grpc|16": [3000.0, 1.0, 300.0, 1.0],
                                   f"{identity}|http|1": [1000.0, 1.0, 300.0, 1.0]},
                        "appliance": {f"{identity}|http|16": [6300.0, 0.5, 150.0, 1.0],
                                      f"{identity}|grpc|16": [5400.0, 0.5, 150.0, 1.0],
                                      f"{identity}|http|1": [3000.0, 1.0, 300.0, 1.0]}}}
    assert doubled(data).splitlines() == [
        f"- met: {identity}, http, c=16, appliance: throughput ≥ 2.0× Triton's (2.10×)",
        f"- MISSED: {identity}, grpc, c=16, appliance: throughput ≥ 2.0× Triton's (1.80×)"]
    assert doubled({"medians": {"baseline": {}, "appliance": {}}}) == ""


@pytest.mark.e2e
@pytest.mark.parametrize("trusted", [False, True], ids=["isolated", "in-process"])
def test_the_appliance_serves_the_bench_repository(tmp_path, trusted):
    repo = write_repository(tmp_path / "repo", trusted=trusted)
    server = start_appliance(repo, tmp_path / "state")
    try:
        if trusted:  # selection measured both plans (the BLS model pins in-process: it cannot be measured)
            for model in ("identity", "bls"):
                with urllib.request.urlopen(f"{server.base}/v2/models/{model}/selection", timeout=10) as answer:
                    decision = json.load(answer)
                assert {row["plan"] for row in decision["candidates"]} >= {"python", "python:in-process"}
            assert decision["plan"]["plan"] == "python:in-process"
        http = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        data = np.arange(16, dtype=np.float32).reshape(1, 16)
        for model in ("identity", "identity_batched", "bls", "pipeline"):
            tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
            tensor.set_data_from_numpy(data)
            assert np.array_equal(http.infer(model, [tensor]).as_numpy("OUTPUT0"), data), model
        sums = []
        for step, value in enumerate((3, 4, 5)):
            tensor = httpclient.InferInput("INPUT0", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
            answer = http.infer("accumulate", [tensor], sequence_id=7, sequence_start=step == 0,
                                sequence_end=step == 2)
            sums.append(int(answer.as_numpy("OUTPUT0")[0, 0]))
        assert sums == [3, 7, 12]
        http.close()
        responses: list = []
        done = threading.Event()

        def collect(result, error):
            responses.append(error or result)
            if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
                done.set()

        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        grpc.start_stream(collect)
        tensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(data)
        grpc.async_stream_infer("repeat", [tensor], enable_empty_final_response=True)
        assert done.wait(30)
        grpc.stop_stream()
        grpc.close()
        outputs = [r.as_numpy("OUTPUT0") for r in responses if r.as_numpy("OUTPUT0") is not None]
        assert len(outputs) == REPEATS and all(np.array_equal(o, data) for o in outputs)
    finally:
        server.stop()
