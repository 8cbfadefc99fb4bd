"""The bearer token over gRPC: control RPCs need 'authorization: Bearer <token>' metadata unless the peer
is exempt. A relay makes the client reach the daemon from 127.0.0.2, which looks remote once the exempt
networks are narrowed to 127.0.0.1."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from tests.builders import affine_model, write_model
from tests.relay import relay

REMOTE = "127.0.0.2"


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "m", affine_model(1.0, 0.0))
    return repo


def _start(start_daemon, repo, tmp_path, env=None):
    state = tmp_path / "state"
    daemon = start_daemon(repo, "--model-control-mode", "explicit", "--load-model", "*", state=state,
                          env={"APPLIANCE_AUTH_EXEMPT_NETWORKS": "127.0.0.1/32",
                               **(env or {})})
    return daemon, (state / "auth-token").read_text().strip()


def _infer(client, headers=None):
    tensor = triton.InferInput("x", [1, 8], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 8), np.float32))
    return client.infer("m", [tensor], headers=headers)


def _refused(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as excinfo:
        call()
    assert excinfo.value.status() == "StatusCode.UNAUTHENTICATED"
    return excinfo.value


def test_control_needs_the_token_off_loopback(start_daemon, repo, tmp_path):
    daemon, token = _start(start_daemon, repo, tmp_path)
    with relay(daemon.grpc_port, REMOTE) as port, triton.InferenceServerClient(f"127.0.0.1:{port}") as remote:
        error = _refused(lambda: remote.load_model("m"))
        assert "authorization: Bearer <token>" in error.message() and "auth-token" in error.message()
        _refused(lambda: remote.unload_model("m", headers={"authorization": "Bearer wrong"}))
        _refused(lambda: remote.update_log_settings({"log_info": True}))
        _refused(lambda: remote.update_trace_settings(settings={"trace_rate": "2"}))
        remote.load_model("m", headers={"authorization": f"Bearer {token}"})
        remote.update_log_settings({"log_info": True}, headers={"authorization": f"Bearer {token}"})
        # Reading settings, inference and metadata stay open unless protect_inference is set.
        assert remote.get_log_settings().settings["log_info"].bool_param
        assert _infer(remote).as_numpy("y").shape == (1, 8)
        assert remote.get_model_metadata("m").name == "m"
    with triton.InferenceServerClient(daemon.grpc_url) as local:
        local.unload_model("m")  # 127.0.0.1 is exempt


def test_protect_inference(start_daemon, repo, tmp_path):
    daemon, token = _start(start_daemon, repo, tmp_path, env={"APPLIANCE_PROTECT_INFERENCE": "true"})
    with relay(daemon.grpc_port, REMOTE) as port, triton.InferenceServerClient(f"127.0.0.1:{port}") as remote:
        _refused(lambda: _infer(remote))
        _refused(lambda: remote.get_model_metadata("m"))
        _refused(lambda: remote.get_inference_statistics())
        assert remote.is_server_live() and remote.is_server_ready()  # health stays open
        authorized = {"authorization": f"Bearer {token}"}
        assert _infer(remote, authorized).as_numpy("y").shape == (1, 8)
        errors: queue.Queue = queue.Queue()
        remote.start_stream(callback=lambda result, error: errors.put(error))
        try:
            assert "UNAUTHENTICATED" in str(errors.get(timeout=10).status())  # the stream is refused at once
        finally:
            remote.stop_stream()
