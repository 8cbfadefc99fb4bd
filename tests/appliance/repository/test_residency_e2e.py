"""Residency end to end, with real model processes: four Python models that each hold ~200 MiB served
under a 500 MiB budget (every request answered, the tree's RSS never more than the budget above the idle
daemon, evictions counted), a model larger than the budget refused with 507, a burst of first requests
loading a model once, an idle model's process ending, and a sequence in flight outliving idle time."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from appliance.examples.sequence import write_sequence_model
from appliance.repository.memory import process_rss
from tests.models import copy_model
from tests.models.sequence import simple_sequence_config, simple_sequence_model
from tests.processes import running
from tests.waiting import wait_until

MIB = 1024 * 1024
BUDGET_MIB = 500

@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("residency")
    for name in ("hog_a", "hog_b", "hog_c", "hog_d"):  # each ~200 MiB resident
        copy_model(repo, "repository/hog", name)
    copy_model(repo, "repository/hog", "huge", config="huge")  # declares 2048 MiB
    copy_model(repo, "repository/hog", "light", config="light")
    write_sequence_model(repo, "simple_sequence", simple_sequence_model(False), simple_sequence_config(False))
    return repo


def _post(daemon, path: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(daemon.base + path, data=data, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def _infer(daemon, model: str) -> tuple[int, dict]:
    return _post(daemon, f"/v2/models/{model}/infer",
                 {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}]})


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and every process below it, summed as the daemon sums a model's processes."""
    return process_rss([pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))])


def _metric(daemon, name: str, **labels: str) -> float:
    """The value of ``name`` with ``labels`` in /metrics (0 when absent)."""
    with urllib.request.urlopen(daemon.base + "/metrics", timeout=30) as answer:
        text = answer.read().decode()
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        metric, _, rest = sample.partition("{")
        found = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if metric == name and found == labels:
            return float(value)
    return 0.0


def _state(daemon, model: str) -> tuple[str, str]:
    _, rows = _post(daemon, "/v2/repository/index", {})
    row = next(r for r in rows if r["name"] == model)  # type: ignore[attr-defined]
    return row["state"], row.get("reason", "")


@pytest.fixture(scope="module")
def budgeted(module_daemon, repository):
    return module_daemon(repository, "--load-on-demand", "--model-memory-budget-mib", str(BUDGET_MIB))


def test_rotating_over_models_larger_together_than_the_budget_stays_under_it(budgeted):
    idle = _tree_rss(budgeted.process.pid)
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], _tree_rss(budgeted.process.pid) - idle)
            except psutil.NoSuchProcess:
                pass
            stop.wait(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        for model in ["hog_a", "hog_b", "hog_c", "hog_d"] * 2:
            status, answer = _infer(budgeted, model)
            assert status == 200, answer
            assert answer["outputs"][0]["data"] == [2.0, 3.0]
    finally:
        stop.set()
        sampler.join()
    assert peak[0] <= BUDGET_MIB * MIB, f"the tree held {peak[0] / MIB:.0f} MiB over the idle daemon"
    assert peak[0] >= 300 * MIB  # two models at a time did load (the sampler saw them)
    evictions = sum(_metric(budgeted, "appliance_model_unloads", model=m, cause="budget")
                    for m in ("hog_a", "hog_b", "hog_c", "hog_d"))
    assert evictions >= 6
    assert _metric(budgeted, "appliance_model_memory_bytes", model="hog_d") > 150 * MIB


def test_a_model_larger_than_the_budget_is_refused_with_507(budgeted):
    status, answer = _infer(budgeted, "huge")
    assert status == 507
    assert "'huge' needs about 2048 MiB" in answer["error"] and f"budget is {BUDGET_MIB} MiB" in answer["error"]


def test_a_burst_of_first_requests_loads_the_model_once(budgeted):
    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(lambda _: _infer(budgeted, "light"), range(50)))
    assert [status for status, _ in answers] == [200] * 50
    assert _metric(budgeted, "appliance_model_loads", model="light", cause="demand") == 1


@pytest.fixture(scope="module")
def idling(module_daemon, repository):
    return module_daemon(repository, "--load-on-demand", "--idle-unload-secs", "1")


def test_an_idle_models_process_ends_and_its_next_request_loads_it_again(idling):
    before = {p.pid for p in psutil.Process(idling.process.pid).children(recursive=True)}
    assert _infer(idling, "light")[0] == 200
    started = {p.pid for p in psutil.Process(idling.process.pid).children(recursive=True)} - before
    assert started, "the model's process"
    wait_until(lambda: not any(map(running, started)), timeout=30, what="the idle model's process to end")
    state, reason = _state(idling, "light")
    assert state == "UNAVAILABLE" and "idle_unload_secs" in reason
    assert _infer(idling, "light")[0] == 200
    assert _metric(idling, "appliance_model_unloads", model="light", cause="idle") >= 1


def test_a_sequence_in_flight_survives_idle_time(idling):
    def step(start: bool, value: int) -> tuple[int, dict]:
        return _post(idling, "/v2/models/simple_sequence/infer", {
            "parameters": {"sequence_id": 7, "sequence_start": start},
            "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [value]}]})

    assert step(True, 5)[0] == 200
    started = time.monotonic()
    assert _infer(idling, "light")[0] == 200
    # Idle time passes: the other model goes, the sequence's model stays.
    wait_until(lambda: _state(idling, "light")[0] == "UNAVAILABLE" and time.monotonic() - started > 1.5,
               timeout=30, what="idle time to pass")
    assert _state(idling, "simple_sequence")[0] == "READY"
    status, answer = step(False, 4)
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == [4]
