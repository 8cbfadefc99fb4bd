"""Control endpoints need the bearer token unless the client is exempt (loopback by default); a client
on 127.0.0.2 is made to look remote by narrowing the exempt networks to 127.0.0.1."""

from __future__ import annotations

import stat
import threading

import pytest

from appliance.examples import mlp_model
from tests.builders import affine_model, write_model
from tests.http_util import call
from tests.waiting import wait_until

REMOTE = "127.0.0.2"
BODY = {"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP32", "data": [1.0] * 8}]}


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "m", affine_model(1.0, 0.0))
    return repo


def _start(start_daemon, repo, tmp_path, *args, env=None):
    state = tmp_path / "state"
    daemon = start_daemon(repo, "--model-control-mode", "explicit", "--load-model", "*", *args, state=state,
                          env={"APPLIANCE_AUTH_EXEMPT_NETWORKS": "127.0.0.1/32", **(env or {})})
    return daemon, (state / "auth-token")


def test_token_file_is_created_private(start_daemon, repo, tmp_path):
    _, token_file = _start(start_daemon, repo, tmp_path)
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert len(token_file.read_text().strip()) >= 32


def test_control_needs_the_token_off_loopback(start_daemon, repo, tmp_path):
    daemon, token_file = _start(start_daemon, repo, tmp_path)
    token = token_file.read_text().strip()
    path = "/v2/repository/models/m/load"
    status, headers, payload = call(daemon.port, "POST", path, {}, source=REMOTE)
    assert status == 401 and "Bearer" in headers["WWW-Authenticate"] and "auth-token" in payload["error"]
    status, _, _ = call(daemon.port, "POST", path, {}, headers={"Authorization": "Bearer wrong"}, source=REMOTE)
    assert status == 401
    status, _, _ = call(daemon.port, "POST", path, {}, headers={"Authorization": f"Bearer {token}"}, source=REMOTE)
    assert status == 200
    assert call(daemon.port, "POST", path, {})[0] == 200  # 127.0.0.1 is exempt
    # Inference stays open unless protect_inference is set.
    assert call(daemon.port, "POST", "/v2/models/m/infer", BODY, source=REMOTE)[0] == 200
    # Trace settings: reading them is like metadata, changing them is control.
    change = {"trace_rate": "7"}
    for trace_path in ("/v2/trace/setting", "/v2/models/m/trace/setting"):
        assert call(daemon.port, "GET", trace_path, source=REMOTE)[0] == 200
        assert call(daemon.port, "POST", trace_path, change, source=REMOTE)[0] == 401
        status, _, answered = call(daemon.port, "POST", trace_path, change,
                                   headers={"Authorization": f"Bearer {token}"}, source=REMOTE)
        assert status == 200 and answered["trace_rate"] == "7"


def test_behind_a_trusted_proxy_the_forwarded_client_decides(start_daemon, repo, tmp_path):
    daemon, _ = _start(start_daemon, repo, tmp_path, env={"APPLIANCE_TRUSTED_PROXIES": "127.0.0.1/32"})
    path = "/v2/repository/models/m/load"
    status, _, payload = call(daemon.port, "POST", path, {}, headers={"X-Forwarded-For": "192.168.1.20"})
    assert status == 401, payload  # a LAN client behind the local proxy is not loopback
    assert call(daemon.port, "POST", path, {})[0] == 200  # the proxy's own requests stay exempt


def test_protect_inference(start_daemon, repo, tmp_path):
    daemon, token_file = _start(start_daemon, repo, tmp_path, env={"APPLIANCE_PROTECT_INFERENCE": "true"})
    token = token_file.read_text().strip()
    assert call(daemon.port, "POST", "/v2/models/m/infer", BODY, source=REMOTE)[0] == 401
    assert call(daemon.port, "GET", "/metrics", source=REMOTE)[0] == 401
    assert call(daemon.port, "GET", "/v2/health/ready", source=REMOTE)[0] == 200  # health stays open
    authorized = {"Authorization": f"Bearer {token}"}
    assert call(daemon.port, "POST", "/v2/models/m/infer", BODY, headers=authorized, source=REMOTE)[0] == 200
    for route in ("generate", "generate_stream"):  # Triton's generate extension: inference, same rules
        path = f"/v2/models/m/{route}"
        assert call(daemon.port, "POST", path, {"x": [1.0] * 8}, source=REMOTE)[0] == 401
        assert call(daemon.port, "POST", path, {"x": [1.0] * 8}, headers=authorized, source=REMOTE)[0] == 200


def test_generate_bodies_keep_to_max_request_bytes(start_daemon, repo, tmp_path):
    daemon, _ = _start(start_daemon, repo, tmp_path, env={"APPLIANCE_MAX_REQUEST_BYTES": "2000"})
    for route in ("generate", "generate_stream"):
        status, _, payload = call(daemon.port, "POST", f"/v2/models/m/{route}", {"x": [1.0] * 8, "pad": "x" * 4000})
        assert status == 413 and "max_request_bytes" in payload["error"]


def test_protect_inference_covers_the_metrics_port(start_daemon, repo, tmp_path):
    import re

    daemon, token_file = _start(start_daemon, repo, tmp_path, "--metrics-port", "0",
                                env={"APPLIANCE_PROTECT_INFERENCE": "true"})
    found = wait_until(lambda: re.search(r"serving Prometheus metrics on http://127\.0\.0\.1:(\d+)/metrics",
                                         daemon.log()), timeout=10, what="the metrics port bound", interval=0.05)
    port = int(found.group(1))
    assert call(port, "GET", "/metrics", source=REMOTE)[0] == 401
    authorized = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
    assert call(port, "GET", "/metrics", headers=authorized, source=REMOTE)[0] == 200
    assert call(port, "GET", "/metrics", headers={"Host": "rebind.example"})[0] == 403


def test_token_from_settings(start_daemon, repo, tmp_path):
    daemon, _ = _start(start_daemon, repo, tmp_path, env={"APPLIANCE_AUTH_TOKEN": "s3cret-token-of-24-chars"})
    headers = {"Authorization": "Bearer s3cret-token-of-24-chars"}
    assert call(daemon.port, "POST", "/v2/repository/models/m/unload", {}, headers=headers, source=REMOTE)[0] == 200


def _pending(port: int, model: str) -> float:
    """The model's nv_inference_pending_request_count on /metrics: requests queued, not yet executing."""
    text = call(port, "GET", "/metrics")[2]
    text = text.decode() if isinstance(text, bytes) else str(text)
    prefix = f'nv_inference_pending_request_count{{model="{model}",'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def test_concurrent_request_limit(start_daemon, tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "slow", mlp_model(), config=(
        "max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 1000000 }\n"))
    daemon = start_daemon(repo, env={"APPLIANCE_MAX_CONCURRENT_REQUESTS": "2"})
    body = {"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": [0.0] * 784}]}
    statuses: list[int] = []
    threads = [threading.Thread(target=lambda: statuses.append(
        call(daemon.port, "POST", "/v2/models/slow/infer", body)[0])) for _ in range(2)]
    for thread in threads:
        thread.start()
    # Both wait in slow's queue (up to a second) and hold the two slots.
    wait_until(lambda: _pending(daemon.port, "slow") == 2, timeout=10, what="both requests in slow's queue")
    status, headers, payload = call(daemon.port, "POST", "/v2/models/slow/infer", body)
    assert status == 503 and "max_concurrent_requests" in payload["error"] and headers["Retry-After"] == "1"
    for thread in threads:
        thread.join(30)
    assert statuses == [200, 200]
