"""Model control (Triton's repository extension): modes, load/unload/index through tritonclient,
reload without downtime under load, failed reloads, and names that try to leave the repository."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.builders import affine_model, save, write_model
from tests.http_util import call
from tests.waiting import wait_until


def _x() -> list:
    tensor = triton.InferInput("x", [1, 8], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 8), np.float32))
    return [tensor]


def _y(client, model="m") -> float:
    return float(client.infer(model, _x()).as_numpy("y")[0, 0])


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "m", affine_model(1.0, 0.0))
    write_model(repo, "other", affine_model(5.0, 0.0))
    return repo


def test_mode_none_refuses_the_api(start_daemon, repo):
    daemon = start_daemon(repo)
    with triton.InferenceServerClient(daemon.url) as client:
        with pytest.raises(InferenceServerException, match="explicit model load / unload is not allowed if polling "
                                                           "is enabled; .*--model-control-mode explicit") as info:
            client.load_model("m")
        assert info.value.status() == "503"  # Triton's words and status (UNAVAILABLE)
        assert client.is_model_ready("m") and client.is_model_ready("other")


def test_explicit_mode_loads_what_it_is_told(start_daemon, repo):
    daemon = start_daemon(repo, "--model-control-mode", "explicit", "--load-model", "m")
    with triton.InferenceServerClient(daemon.url) as client:
        index = {row["name"]: row for row in client.get_model_repository_index()}
        assert index["m"]["state"] == "READY"
        assert index["other"]["state"] == "UNAVAILABLE" and "not loaded" in index["other"]["reason"]
        assert client.is_server_ready()  # a model left unloaded on purpose is no failure
        client.load_model("other")
        assert _y(client, "other") == 5.0
        client.unload_model("m", unload_dependents=True)
        assert not client.is_model_ready("m")
        index = {row["name"]: row for row in client.get_model_repository_index()}
        assert index["m"]["state"] == "UNAVAILABLE" and index["m"]["reason"] == "unloaded"
        with pytest.raises(InferenceServerException):
            client.infer("m", _x())
        client.load_model("m")
        assert _y(client) == 1.0


def test_load_with_a_config_override(start_daemon, repo):
    daemon = start_daemon(repo, "--model-control-mode", "explicit", "--load-model", "*")
    with triton.InferenceServerClient(daemon.url) as client:
        config = json.dumps({"max_batch_size": 2, "dynamic_batching": {}})
        client.load_model("m", config=config)
        assert client.get_model_config("m")["max_batch_size"] == 2
        with pytest.raises(InferenceServerException, match="failed to load 'm', failed to poll from model repository: "
                                                           "parameters.config is not valid JSON"):
            client.load_model("m", config="{not json")


@pytest.fixture
def hammer():
    """hammer(daemon, clients) -> (results, failures, stop): clients inferring on model "m" until
    ``stop()``; the fixture stops and joins them after the test, whatever it got to."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(daemon, clients: int) -> tuple[list[float], list[str], Callable[[], None]]:
        results: list[float] = []
        failures: list[str] = []

        def infer() -> None:
            with triton.InferenceServerClient(daemon.url) as client:
                while not stop.is_set():
                    try:
                        results.append(_y(client))
                    except Exception as exc:  # any failure during a reload is a bug
                        failures.append(repr(exc))

        def stop_all() -> None:
            stop.set()
            for thread in threads:
                thread.join(30)

        threads.extend(threading.Thread(target=infer) for _ in range(clients))
        for thread in threads:
            thread.start()
        return results, failures, stop_all

    yield start
    stop.set()
    for thread in threads:
        thread.join(30)


def _served(results: list[float], count: int) -> None:
    """Until the hammering clients got ``count`` more answers."""
    start = len(results)
    wait_until(lambda: len(results) >= start + count, timeout=60, what=f"{count} more answers")


def test_reload_without_downtime_under_load(start_daemon, repo, hammer):
    daemon = start_daemon(repo, "--model-control-mode", "explicit", "--load-model", "*")
    results, failures, stop = hammer(daemon, clients=4)
    with triton.InferenceServerClient(daemon.url) as client:
        for scale in (2.0, 3.0, 4.0):
            _served(results, 15)  # the clients are answered by this version a while
            save(affine_model(scale, 0.0), repo / "m" / "1" / "model.onnx")
            client.load_model("m")  # returns once the new version serves
            assert _y(client) == scale
    _served(results, 15)
    stop()
    assert failures == []
    assert len(results) > 50 and set(results) <= {1.0, 2.0, 3.0, 4.0} and results[-1] == 4.0
    print(f"reload under load: {len(results)} requests, {len(failures)} failures")


def test_failed_reload_keeps_the_old_version(start_daemon, repo):
    daemon = start_daemon(repo, "--model-control-mode", "explicit", "--load-model", "*")
    (repo / "m" / "1" / "model.onnx").write_bytes(b"truncated")
    with triton.InferenceServerClient(daemon.url) as client:
        with pytest.raises(InferenceServerException, match="failed to load"):
            client.load_model("m")
        assert _y(client) == 1.0  # still the old one
        (row,) = [r for r in client.get_model_repository_index() if r["name"] == "m"]
        assert row["state"] == "READY" and "reload failed" in row["reason"]


def test_poll_mode_follows_the_repository(start_daemon, repo):
    daemon = start_daemon(repo, "--model-control-mode", "poll", "--repository-poll-secs", "0.3")
    with triton.InferenceServerClient(daemon.url) as client:
        write_model(repo, "added", affine_model(7.0, 0.0))
        save(affine_model(9.0, 0.0), repo / "m" / "1" / "model.onnx")
        import shutil

        shutil.rmtree(repo / "other")
        wait_until(lambda: {r["name"] for r in client.get_model_repository_index()} == {"m", "added"}
                   and client.is_model_ready("added") and _y(client) == 9.0,
                   timeout=20, interval=0.2, what="the repository's changes applied")
        assert {r["name"] for r in client.get_model_repository_index()} == {"m", "added"}
        assert _y(client, "added") == 7.0 and _y(client) == 9.0


@pytest.mark.parametrize("name,statuses", [
    ("..", {400, 404}),
    ("%2e%2e", {400, 404}),
    ("..%2fetc", {400, 404}),
    ("a%2fb", {400, 404}),
    ("%00", {400, 404}),
    ("x" * 300, {400}),
    ("outside", {400}),
])
def test_names_cannot_leave_the_repository(start_daemon, repo, tmp_path, name, statuses):
    (tmp_path / "elsewhere" / "1").mkdir(parents=True)
    (repo / "outside").symlink_to(tmp_path / "elsewhere")
    daemon = start_daemon(repo, "--model-control-mode", "explicit", "--load-model", "m")
    for path in (f"/v2/repository/models/{name}/load", f"/v2/repository/models/{name}/unload",
                 f"/v2/models/{name}", f"/v2/models/{name}/infer"):
        method = "POST" if "repository" in path or "infer" in path else "GET"
        status, _, payload = call(daemon.port, method, path, b"{}")
        assert status in statuses | {404}, (path, status, payload)
        assert isinstance(payload, dict) and "error" in payload
    assert daemon.process.poll() is None
