"""Triton's own command lines start the appliance unchanged: SERVER_ARGS lines from Triton's qa test.sh
files (triton-inference-server/server, qa/L0_*/test.sh), their directories replaced by temporary ones. The
test harness adds only the loopback host, ephemeral ports and a state directory."""

from __future__ import annotations

import json
import re
import urllib.request

import numpy as np
import pytest
import tritonclient.http as triton

from appliance.examples import build_example_repository

# Each line as its test.sh writes it; {models} is the repository directory (`pwd`/models, ${MODELDIR}).
QA_LINES = {
    # qa/L0_metrics/test.sh, the GPU peer-access test: BASE_SERVER_ARGS="--model-repository=${MODELDIR}",
    # CUSTOM_PINNED_MEMORY_POOL_SIZE=0.
    "L0_metrics": "--model-repository={models} --model-control-mode=explicit --log-verbose=1 "
                  "--pinned-memory-pool-byte-size=0 --enable-peer-access=FALSE --cuda-memory-pool-byte-size 0:0 "
                  "--log-verbose=1",
    # qa/L0_lifecycle/test.sh
    "L0_lifecycle": "--model-repository={models} --model-control-mode=explicit --model-load-thread-count=32 "
                    "--log-verbose=2",
    # qa/L0_grpc_state_cleanup/test.sh
    "L0_grpc_state_cleanup": "--model-repository={models} --log-verbose=2 "
                             "--grpc-restricted-protocol=inference:infer-key=infer-value",
}


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())


@pytest.mark.parametrize("suite", list(QA_LINES))
def test_a_qa_command_line_starts_the_appliance_and_it_serves(suite, start_daemon, tmp_path):
    models = build_example_repository(tmp_path / "models")
    daemon = start_daemon(None, *QA_LINES[suite].format(models=models).split())
    log = daemon.log()
    assert "unrecognized arguments" not in log and " DEBUG " in log  # --log-verbose took effect
    assert _get(daemon.base + "/v2")["name"] == "triton"
    with triton.InferenceServerClient(daemon.url) as client:
        if "explicit" in QA_LINES[suite]:
            assert not client.is_model_ready("simple")
            client.load_model("simple")
        assert client.is_server_ready() and client.is_model_ready("simple")
        data = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [triton.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(data)
        result = client.infer("simple", inputs)
        assert (result.as_numpy("OUTPUT0") == data + data).all()
    if suite == "L0_metrics":  # the flags that mean nothing here each said so, once
        for flag in ("--pinned-memory-pool-byte-size", "--enable-peer-access", "--cuda-memory-pool-byte-size"):
            assert log.count(f"{flag} is accepted, but") == 1, log


def test_tritons_server_flags_reach_metadata_the_ports_and_the_log(start_daemon, tmp_path):
    models = build_example_repository(tmp_path / "models")
    daemon = start_daemon(models, "--id=edge-box-1", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
                          "--metrics-address=127.0.0.1", "--metrics-port=0", "--allow-metrics=true",
                          "--log-format=ISO8601", "--metrics-interval-ms=500")
    assert _get(daemon.base + "/v2")["name"] == "edge-box-1"
    port = re.search(r"serving Prometheus metrics on http://127\.0\.0\.1:(\d+)/metrics", daemon.log())
    assert port is not None, daemon.log()
    with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/metrics", timeout=10) as answer:
        assert answer.status == 200
    assert re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO ", daemon.log(), re.MULTILINE), daemon.log()
