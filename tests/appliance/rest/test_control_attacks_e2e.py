"""What an attacker on the box, on the LAN or in a web page can send to the control endpoints: configs
that name files outside the model, cross-site and DNS-rebinding requests, paths that decode
differently from how they route. Each is refused with a 4xx that says why, and the daemon stays
healthy while it happens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from appliance.examples import build_example_repository
from tests.health_watch import HealthWatch
from tests.http_util import call
from tests.models import MODELS

REMOTE = "127.0.0.2"
INFER = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
                    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}]}


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    """A directory outside the repository holding what an attacker wants run or read."""
    path = tmp_path_factory.mktemp("outside")
    (path / "evil.py").write_text(
        f"open({str(path / 'PWNED')!r}, 'w').write('ran')\n" + (MODELS / "simple" / "add_sub" / "model.py").read_text()
    )
    (path / "secret.txt").write_text("top-secret-label\n")
    return path


@pytest.fixture(scope="module")
def repository(tmp_path_factory, outside):
    repo = build_example_repository(tmp_path_factory.mktemp("x") / "repo")
    (repo / "simple" / "leak.txt").symlink_to(outside / "secret.txt")  # a link inside pointing out
    (repo / "simple" / "warmup").mkdir()
    return repo


@pytest.fixture(scope="module")
def daemon(module_daemon, repository, tmp_path_factory):
    state = tmp_path_factory.mktemp("state")
    return module_daemon(repository, "--model-control-mode", "explicit", "--load-model", "*", state=state,
                         env={"APPLIANCE_AUTH_EXEMPT_NETWORKS": "127.0.0.1/32"})


def _load(daemon, config: dict | str, headers: dict | None = None, **kw):
    raw = config if isinstance(config, str) else json.dumps(config)
    return call(daemon.port, "POST", "/v2/repository/models/simple/load", {"parameters": {"config": raw}},
                headers=headers, **kw)


def _simple_config(**extra) -> dict:
    return {"backend": "onnxruntime", "max_batch_size": 8, **extra}


_TRAVERSAL = "../../../../../../../../.."


@pytest.mark.parametrize("config, field", [
    (_simple_config(backend="python", default_model_filename=f"{_TRAVERSAL}/OUTSIDE/evil.py"),
     "default_model_filename"),
    (_simple_config(default_model_filename="/etc/passwd"), "default_model_filename"),
    (_simple_config(output=[{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [16],
                             "label_filename": f"{_TRAVERSAL}/STATE/auth-token"}]), "label_filename"),
    (_simple_config(output=[{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [16],
                             "label_filename": "/dev/zero"}]), "label_filename"),
    (_simple_config(output=[{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [16],
                             "label_filename": "leak.txt"}]), "label_filename"),
    (_simple_config(model_warmup=[{"name": "w", "batch_size": 1, "inputs": {"INPUT0": {
        "data_type": "TYPE_INT32", "dims": [16], "input_data_file": f"{_TRAVERSAL}/etc/passwd"}}}]),
     "input_data_file"),
])
def test_config_paths_stay_inside_the_model(daemon, outside, config, field):
    text = json.dumps(config).replace("OUTSIDE", str(outside).lstrip("/"))
    text = text.replace("STATE", str(Path(daemon.log_path).parent).lstrip("/"))
    status, _, payload = _load(daemon, text)
    assert status == 400, payload
    assert field in payload["error"] and "failed to load" in payload["error"]
    assert "top-secret" not in json.dumps(payload) and not (outside / "PWNED").exists()
    assert call(daemon.port, "POST", "/v2/models/simple/infer", INFER)[0] == 200  # old version serves on


def test_the_same_rule_for_config_pbtxt_on_disk(start_daemon, tmp_path, outside):
    repo = build_example_repository(tmp_path / "repo")
    (repo / "simple" / "config.pbtxt").write_text(
        (repo / "simple" / "config.pbtxt").read_text().replace(
            'name: "OUTPUT0"', f'name: "OUTPUT0"\n    label_filename: "{_TRAVERSAL}{outside}/secret.txt"'))
    (repo / "simple_string" / "config.pbtxt").unlink()
    (repo / "simple_string" / "config.pbtxt").symlink_to(outside / "secret.txt")
    daemon = start_daemon(repo)
    index = {row["name"]: row for row in call(daemon.port, "POST", "/v2/repository/index", {})[2]}
    assert index["simple"]["state"] == "UNAVAILABLE" and "label_filename" in index["simple"]["reason"]
    assert index["simple_string"]["state"] == "UNAVAILABLE" and "config.pbtxt" in index["simple_string"]["reason"]
    assert index["mlp"]["state"] == "READY"


@pytest.mark.parametrize("config, words", [
    (_simple_config(max_batch_size=-3), "max_batch_size"),
    ({"name": "other"}, "differs from the model"),
    (_simple_config(instance_group=[{"count": 100000, "kind": "KIND_CPU"}]), "instances"),
    (_simple_config(input=[{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [-7]}]), "dims"),
    ("[" * 50_000 + "]" * 50_000, "not valid JSON"),
    ('{"max_batch_size": ' + "[" * 50_000 + "]" * 50_000 + "}", "not valid JSON"),
    ("not json", "not valid JSON"),
    (_simple_config(no_such_field=1), "no_such_field"),
])
def test_override_configs_are_checked_like_config_pbtxt(daemon, config, words):
    status, _, payload = _load(daemon, config)
    assert status == 400 and words in payload["error"], payload


@pytest.mark.parametrize("headers, status", [
    ({"Content-Type": "text/plain"}, 415),
    # libcurl's default type, with none of a browser's headers: a program (perf_analyzer sends its JSON so)
    ({"Content-Type": "application/x-www-form-urlencoded"}, 200),
    # the same type with what a browser adds to a page's POST: a form on a web page
    ({"Content-Type": "application/x-www-form-urlencoded", "Sec-Fetch-Mode": "navigate"}, 415),
    ({"Content-Type": "application/x-www-form-urlencoded", "Sec-Fetch-Site": "same-origin"}, 415),
    ({"Content-Type": "application/x-www-form-urlencoded", "Upgrade-Insecure-Requests": "1"}, 415),
    ({"Content-Type": "application/x-www-form-urlencoded", "Origin": "http://127.0.0.1:1",
      "Host": "127.0.0.1:1"}, 415),  # even a same-origin page
    ({"Content-Type": "multipart/form-data; boundary=x"}, 415),
    ({"Content-Type": "application/json; charset=utf-8"}, 200),
    ({"Content-Type": "application/octet-stream"}, 200),  # tritonclient.http.aio's: needs a preflight
    ({}, 200),  # tritonclient sends no Content-Type
    ({"Origin": "http://evil.example"}, 403),
    ({"Origin": "null"}, 403),
    ({"Sec-Fetch-Site": "cross-site"}, 403),
    ({"Sec-Fetch-Site": "same-site"}, 403),
    ({"Sec-Fetch-Site": "same-origin"}, 200),
    ({"Host": "evil.example:8000"}, 403),
    ({"Host": "localhost"}, 200),
])
def test_control_refuses_what_a_web_page_can_send(daemon, headers, status):
    got, _, payload = call(daemon.port, "POST", "/v2/repository/models/simple/load", b"{}", headers=headers)
    assert got == status, payload
    if status != 200:
        assert payload["error"]


def test_same_origin_page_may_call_control(daemon):
    origin = {"Origin": f"http://127.0.0.1:{daemon.port}", "Host": f"127.0.0.1:{daemon.port}"}
    assert call(daemon.port, "POST", "/v2/repository/models/simple/unload", b"", headers=origin)[0] == 200
    assert call(daemon.port, "POST", "/v2/repository/models/simple/load", b"", headers=origin)[0] == 200


def test_dns_rebinding_host_is_refused_everywhere(daemon):
    for method, path, body in (("GET", "/v2", None), ("POST", "/v2/models/simple/infer", INFER),
                               ("GET", "/v2/probe", None)):
        status, _, payload = call(daemon.port, method, path, body, headers={"Host": "rebind.attacker.example"})
        assert status == 403 and "allowed_hosts" in payload["error"]
    assert call(daemon.port, "POST", "/v2/models/simple/infer", INFER, headers={"Host": "[::1]:1"})[0] == 200


def test_auth_is_decided_by_the_route_not_the_path_text(daemon):
    # %2F decodes to '/' in request.path, but routing keeps it inside the {model} segment.
    for path in ("/v2/repository/models/a%2F..%2Fsimple/load", "/v2/repository/models/simple%2F/unload"):
        status, _, payload = call(daemon.port, "POST", path, b"{}", source=REMOTE)
        assert status == 401, (path, status, payload)


def test_empty_bearer_is_refused(daemon):
    for header in ("Bearer", "Bearer ", "Bearer  ", "bearer\t"):
        status, _, _ = call(daemon.port, "POST", "/v2/repository/models/simple/load", b"{}",
                            headers={"Authorization": header}, source=REMOTE)
        assert status == 401


@pytest.mark.parametrize("path, headers", [
    ("/v2/models/simple/infer", {"Inference-Header-Content-Length": "²"}),
    ("/v2/models/simple/infer", {"Inference-Header-Content-Length": "9" * 5000}),
    ("/v2/models/simple/versions/%C2%B2/infer", {}),
    ("/v2/models/simple/versions/%D9%A1/infer", {}),  # Arabic-Indic one
])
def test_non_ascii_digits_are_refused(daemon, path, headers):
    status, _, payload = call(daemon.port, "POST", path, INFER, headers=headers)
    assert 400 <= status < 500 and payload["error"], (status, payload)


@pytest.mark.parametrize("query", ["since=1e400", "until=1e19&step=1e18", "version=1e30", "step=nan",
                                   "since=-inf", "until=" + "9" * 400])
def test_history_parameters_are_bounded(daemon, query):
    status, _, payload = call(daemon.port, "GET", f"/v2/history?{query}")
    assert status == 400 and "query parameter" in payload["error"], payload


@pytest.mark.parametrize("inputs, words", [
    ([{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [1.5] * 16}], "INT32"),
    ([{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [True] * 16}], "INT32"),
    ([{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [2**40] * 16}], "out of range"),
    ([{"name": "INPUT0", "shape": [0, 2**62], "datatype": "INT32", "data": []}], "elements"),
])
def test_json_values_are_not_silently_converted(daemon, inputs, words):
    body = {"inputs": [*inputs, INFER["inputs"][1]]}
    status, _, payload = call(daemon.port, "POST", "/v2/models/simple/infer", body)
    assert status == 400 and words in payload["error"], payload


def test_bytes_claim_is_checked_before_allocating(daemon):
    """118 bytes claiming 2**30 BYTES elements once cost 8 GiB and froze the loop for seconds."""
    header = json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [1, 2**30], "datatype": "BYTES", "parameters": {"binary_data_size": 0}},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "BYTES", "parameters": {"binary_data_size": 0}},
    ]}).encode()
    with HealthWatch(daemon, keep_alive=False):  # health within 1 s, RSS within 200 MiB, throughout
        for _ in range(20):
            status = call(daemon.port, "POST", "/v2/models/simple_string/infer", header,
                          headers={"Inference-Header-Content-Length": str(len(header))})[0]
            assert status == 400


def test_daemon_stays_healthy_under_the_control_attacks(daemon, outside):
    dev_zero = _simple_config(output=[{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [16],
                                       "label_filename": "/dev/zero"}])
    deep = "[" * 50_000 + "]" * 50_000

    with HealthWatch(daemon, keep_alive=False):  # health within 1 s, RSS within 200 MiB, throughout
        for _ in range(5):
            assert _load(daemon, dev_zero)[0] == 400
            assert _load(daemon, deep)[0] == 400
            assert call(daemon.port, "POST", "/v2/repository/models/simple/load", b"{}",
                        headers={"Content-Type": "text/plain"})[0] == 415
    assert daemon.process.poll() is None
    assert call(daemon.port, "POST", "/v2/models/simple/infer", INFER)[0] == 200


async def test_tritonclient_http_aio_control_calls_work(daemon):
    """Issue 22 item 7: tritonclient.http.aio sends Content-Type: application/octet-stream on load,
    unload, shared-memory unregister and trace updates (a type a page cannot send without a preflight);
    the browser rule refused it with 415."""
    import tritonclient.http.aio as aio

    client = aio.InferenceServerClient(daemon.url)
    try:
        await client.unload_model("simple")
        await client.load_model("simple")
        await client.unregister_system_shared_memory()
        settings = await client.update_trace_settings(settings={"trace_rate": "5"})
        assert settings["trace_rate"] == "5"
        await client.update_trace_settings(settings={"trace_rate": None})
        assert await client.is_model_ready("simple")
    finally:
        await client.close()
