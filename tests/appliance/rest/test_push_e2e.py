"""Model push end to end: tritonclient's load_model(config=, files=) over HTTP and gRPC, `appliance push`,
a restart that keeps the pushed model, and hostile pushes refused with a 4xx leaving nothing on disk."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from tests.builders import affine_model, save, write_model
from tests.http_util import call
from tests.readonly import read_only_prefix

REMOTE = "127.0.0.2"  # looks remote to a daemon that exempts only 127.0.0.1
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def repo(tmp_path):
    write_model(tmp_path / "repo", "affine", affine_model(2, 0))
    return tmp_path / "repo"


@pytest.fixture
def model_dir(tmp_path):
    """A Triton model directory to push: y = 3x."""
    directory = tmp_path / "push" / "tripler"
    save(affine_model(3, 0), directory / "1" / "model.onnx")
    (directory / "config.pbtxt").write_text('backend: "onnxruntime"\nmax_batch_size: 8\n')
    return directory


def _bytes(model_dir) -> bytes:
    return (model_dir / "1" / "model.onnx").read_bytes()


def _pushed(state) -> list[str]:
    root = state / "pushed"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


def _infer_http(url: str, model: str) -> float:
    with triton_http.InferenceServerClient(url) as client:
        tensor = triton_http.InferInput("x", [1, 8], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 8), np.float32))
        return float(client.infer(model, [tensor]).as_numpy("y")[0, 0])


def test_push_over_http_and_grpc_is_served_listed_and_kept_across_a_restart(start_daemon, repo, model_dir, tmp_path):
    state = tmp_path / "state"
    daemon = start_daemon(repo, "--model-control-mode", "explicit", "--load-model", "*", state=state)
    config = json.dumps({"backend": "onnxruntime", "max_batch_size": 8})
    with triton_http.InferenceServerClient(daemon.url) as client:
        client.load_model("tripler", config=config, files={"file:1/model.onnx": _bytes(model_dir)})
        index = {row["name"]: row for row in client.get_model_repository_index()}
    assert index["tripler"]["origin"] == "pushed" and index["affine"]["origin"] == "repository"
    assert _infer_http(daemon.url, "tripler") == 3.0
    with triton_grpc.InferenceServerClient(daemon.grpc_url) as client:  # bytes parameters over gRPC
        client.load_model("affine", config=config, files={"file:4/model.onnx": _bytes(model_dir)})
        assert client.is_model_ready("affine", "4") and not client.is_model_ready("affine", "1")
    assert _infer_http(daemon.url, "affine") == 3.0
    daemon.stop()
    again = start_daemon(repo, "--model-control-mode", "explicit", "--load-model", "affine", state=state)
    assert _infer_http(again.url, "tripler") == 3.0  # pushed models load again at start, in explicit mode too
    assert _infer_http(again.url, "affine") == 3.0
    with triton_http.InferenceServerClient(again.url) as client:
        client.load_model("affine")  # a plain load serves the repository's model again and forgets the push
        client.unload_model("tripler")
        assert {row["name"] for row in client.get_model_repository_index()} == {"affine"}
    assert _infer_http(again.url, "affine") == 2.0
    assert _pushed(state) == []


def test_appliance_push_names_each_box_and_fails_for_a_box_that_refuses(start_daemon, repo, model_dir, tmp_path):
    good = start_daemon(repo)  # model control mode none: a push still loads
    refusing = start_daemon(repo, "--push-max-file-bytes", "100")
    result = subprocess.run(
        [sys.executable, "-m", "appliance", "push", str(model_dir), "--url", good.base, "--url", refusing.base],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"127.0.0.1:{good.port}: tripler loaded in" in result.stdout
    assert f"127.0.0.1:{refusing.port}: FAILED" in result.stdout
    assert f"failed on 1 of 2 box(es): 127.0.0.1:{refusing.port}: HTTP 413" in result.stderr
    assert "push_max_file_bytes" in result.stderr
    assert _infer_http(good.url, "tripler") == 3.0
    ok = subprocess.run([sys.executable, "-m", "appliance", "push", str(model_dir), "--url", good.base, "--name", "t2"],
                        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert ok.returncode == 0 and "t2 loaded on 1 box(es)" in ok.stdout, ok.stdout + ok.stderr
    assert _infer_http(good.url, "t2") == 3.0
    fleet = subprocess.run([sys.executable, "-m", "appliance", "fleet", "--json", "--url", good.base],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    (row,) = json.loads(fleet.stdout)
    assert row["models_ready"] == 3 and row["models_total"] == 3 and row["version"] and row["error"] is None


def test_hostile_pushes_are_refused_and_leave_nothing(start_daemon, repo, model_dir, tmp_path):
    state = tmp_path / "state"
    daemon = start_daemon(repo, "--push-max-file-bytes", "4096", state=state,
                          env={"APPLIANCE_AUTH_EXEMPT_NETWORKS": "127.0.0.1/32"})
    token = (state / "auth-token").read_text().strip()
    config = '{"backend": "onnxruntime"}'
    onnx_b64 = base64.b64encode(_bytes(model_dir)).decode()
    path = "/v2/repository/models/evil/load"
    hostile = {
        "parent": {"config": config, "file:../../evil/1/model.onnx": onnx_b64},
        "nested parent": {"config": config, "file:1/../../../x": onnx_b64},
        "absolute": {"config": config, "file:/tmp/evil-appliance-push": onnx_b64},
        "oversized": {"config": config, "file:1/model.onnx": base64.b64encode(b"x" * 5000).decode()},
        "no config": {"file:1/model.onnx": onnx_b64},
        "not a model": {"config": config, "file:1/model.onnx": "AAAA"},
    }
    for what, parameters in hostile.items():
        status, _, answer = call(daemon.port, "POST", path, {"parameters": parameters})
        assert 400 <= status < 500, (what, status, answer)
        assert answer["error"], what
    status, _, answer = call(daemon.port, "POST", path, {"parameters": {"config": config,
                                                                        "file:1/model.onnx": onnx_b64}},
                             source=REMOTE)
    assert status == 401, answer
    assert _pushed(state) == []
    assert not (tmp_path / "evil").exists() and not (state.parent / "evil").exists()
    assert not Path("/tmp/evil-appliance-push").exists()
    assert "evil" not in {row["name"] for row in call(daemon.port, "POST", "/v2/repository/index", {})[2]}
    with triton_grpc.InferenceServerClient(daemon.grpc_url) as client, \
            pytest.raises(InferenceServerException) as excinfo:
        client.load_model("evil", config=config, files={"file:" + "A" * 256: b"abc"})  # as Triton's example
    assert excinfo.value.status() == "StatusCode.INTERNAL"  # Triton's code (its gRPC model-control example)
    assert "failed to poll from model repository" in excinfo.value.message()
    status, _, _ = call(daemon.port, "POST", path, {"parameters": {"config": config, "file:1/model.onnx": onnx_b64}},
                        headers={"Authorization": f"Bearer {token}"}, source=REMOTE)
    assert status == 200  # with the token, from the same address


def test_a_read_only_state_dir_serves_what_was_pushed_and_refuses_new_pushes(start_daemon, repo, model_dir, tmp_path):
    state = tmp_path / "state"
    daemon = start_daemon(repo, state=state)
    with triton_http.InferenceServerClient(daemon.url) as client:
        client.load_model("tripler", config='{"backend": "onnxruntime"}',
                          files={"file:1/model.onnx": _bytes(model_dir)})
    daemon.stop()
    again = start_daemon(repo, state=state, prefix=read_only_prefix(state))
    assert _infer_http(again.url, "tripler") == 3.0
    status, _, answer = call(again.port, "POST", "/v2/repository/models/other/load",
                             {"parameters": {"config": "{}", "file:1/model.onnx": "AAAA"}})
    assert status == 501 and "state dir is not writable" in answer["error"]


def test_the_fleet_endpoint_says_when_mdns_is_off(start_daemon, repo):
    daemon = start_daemon(repo)
    status, _, answer = call(daemon.port, "GET", "/v2/fleet")
    assert status == 200 and answer["mdns"] is False and answer["boxes"] == [] and "--no-mdns" in answer["reason"]
