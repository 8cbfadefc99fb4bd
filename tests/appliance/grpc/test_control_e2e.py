"""Model control, log settings and limits over gRPC: explicit load/unload with a config override, log
settings that change the daemon's log at run time, max_request_bytes and the memory budget, --no-grpc."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from tests.builders import affine_model, write_model
from tests.waiting import wait_until


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "affine", affine_model(2.0, 1.0), config="max_batch_size: 8\n")
    write_model(repo, "other", affine_model(3.0, 0.0))
    return repo


def _infer(client, model: str, rows: int = 1) -> np.ndarray:
    tensor = triton.InferInput("x", [rows, 8], "FP32")
    tensor.set_data_from_numpy(np.ones((rows, 8), np.float32))
    return client.infer(model, [tensor]).as_numpy("y")


def _wait_for(daemon, pattern: str, after: int = 0, timeout: float = 10) -> re.Match:
    try:
        return wait_until(lambda: re.search(pattern, daemon.log()[after:], re.MULTILINE), timeout=timeout,
                          what=f"{pattern!r} in the log", interval=0.05)
    except AssertionError:
        raise AssertionError(f"{pattern!r} not in the log:\n{daemon.log()[after:]}") from None


def test_explicit_load_unload_and_config_override(start_daemon, repo):
    daemon = start_daemon(repo, "--model-control-mode", "explicit", "--load-model", "affine")
    with triton.InferenceServerClient(daemon.grpc_url) as client:
        index = {m.name: m.state for m in client.get_model_repository_index().models}
        assert index == {"affine": "READY", "other": "UNAVAILABLE"}
        assert not client.is_model_ready("other")
        client.load_model("other")
        assert client.is_model_ready("other")
        np.testing.assert_allclose(_infer(client, "other"), 3.0)
        client.load_model("affine", config='{"max_batch_size": 16}')
        assert client.get_model_config("affine").config.max_batch_size == 16
        assert _infer(client, "affine", rows=12).shape == (12, 8)
        with pytest.raises(InferenceServerException, match="failed to load") as excinfo:
            client.load_model("affine", config='"parameters": {"config": {{"max_batch_size": "16"}}}')
        assert excinfo.value.status() == "StatusCode.INTERNAL"  # as Triton (docs/differences-from-triton.md)
        assert client.is_model_ready("affine")  # a failed reload keeps the old version serving
        with pytest.raises(InferenceServerException, match="failed to load 'affine'") as excinfo:
            client.load_model("affine", config="{}", files={"file:1/model.onnx": b"junk"})  # not an ONNX file
        assert excinfo.value.status() == "StatusCode.INVALID_ARGUMENT"
        with pytest.raises(InferenceServerException, match="failed to load 'missing', failed to poll from model "
                                                           "repository") as excinfo:
            client.load_model("missing")
        assert excinfo.value.status() == "StatusCode.INTERNAL"  # as Triton
        with pytest.raises(InferenceServerException, match="invalid model name") as excinfo:
            client.load_model("../etc")
        assert excinfo.value.status() == "StatusCode.INVALID_ARGUMENT"
        client.unload_model("other", unload_dependents=True)
        assert not client.is_model_ready("other")
        with pytest.raises(InferenceServerException, match="'other' has no available versions") as excinfo:
            _infer(client, "other")
        assert excinfo.value.status() == "StatusCode.NOT_FOUND"  # as Triton


def test_log_settings_change_the_daemons_log(start_daemon, repo):
    """The settings as Triton's typed parameters, a change that reaches the daemon's log, refusals as gRPC
    status codes; which lines each setting lets through is tested below the transports
    (tests/appliance/protocol/test_log_settings.py)."""
    daemon = start_daemon(repo, "--model-control-mode", "explicit")
    with triton.InferenceServerClient(daemon.grpc_url) as client:
        settings = client.get_log_settings(as_json=True)["settings"]
        assert settings["log_info"] == {"bool_param": True}
        assert settings["log_format"] == {"string_param": "default"}
        assert settings["log_verbose_level"] == {"uint32_param": 0}
        mark = len(daemon.log())
        updated = client.update_log_settings({"log_format": "ISO8601"}).settings
        assert updated["log_format"].string_param == "ISO8601"
        _wait_for(daemon, r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO appliance.protocol.log_settings: "
                  r"log settings changed: log_format=ISO8601", mark)
        with pytest.raises(InferenceServerException, match="expect boolean for 'log_error'") as excinfo:
            client.update_log_settings({"log_error": None})  # a value of no type
        assert excinfo.value.status() == "StatusCode.INVALID_ARGUMENT"
        with pytest.raises(InferenceServerException, match="can not be updated") as excinfo:
            client.update_log_settings({"log_file": "/tmp/elsewhere.log"})
        assert excinfo.value.status() == "StatusCode.UNIMPLEMENTED"


def test_message_size_and_memory_budget(start_daemon, repo):
    daemon = start_daemon(repo, env={"APPLIANCE_MAX_REQUEST_BYTES": str(1 << 20),
                                     "APPLIANCE_MAX_REQUEST_MEMORY_BYTES": str(1 << 20)})
    with triton.InferenceServerClient(daemon.grpc_url) as client:
        big = triton.InferInput("x", [1, 400_000], "FP32")  # 1.6 MB: above max_request_bytes
        big.set_data_from_numpy(np.zeros((1, 400_000), np.float32))
        with pytest.raises(InferenceServerException) as excinfo:
            client.infer("affine", [big])
        assert excinfo.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        # 600 KB fits the message limit, but the message and its tensor together exceed the budget.
        half = triton.InferInput("x", [1, 150_000], "FP32")
        half.set_data_from_numpy(np.zeros((1, 150_000), np.float32))
        with pytest.raises(InferenceServerException, match="max_request_memory_bytes") as excinfo:
            client.infer("affine", [half])
        assert excinfo.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        np.testing.assert_allclose(_infer(client, "affine"), 3.0)  # the budget was given back


def test_no_grpc(start_daemon, repo):
    daemon = start_daemon(repo, "--no-grpc")
    assert daemon.grpc_port is None and "gRPC" not in daemon.log()


def test_a_grpc_port_in_use_is_a_clear_error(start_daemon, repo, tmp_path):
    """A port another daemon serves is refused."""
    first = start_daemon(repo)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    result = subprocess.run(
        [sys.executable, "-m", "appliance", "serve", "--no-metrics-port",
         "--host", "127.0.0.1", "--http-port", "0", "--grpc-port",
         str(first.grpc_port), "--no-mdns", "--no-selection", "--state-dir", str(tmp_path / "second"),
         "--model-repository", str(repo)],
        capture_output=True, text=True, timeout=60, env=environment)
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"cannot bind gRPC to 127.0.0.1:{first.grpc_port}" in result.stderr and "--grpc-port" in result.stderr
    with triton.InferenceServerClient(first.grpc_url) as client:  # the first daemon keeps its port
        np.testing.assert_allclose(_infer(client, "affine"), 3.0)
