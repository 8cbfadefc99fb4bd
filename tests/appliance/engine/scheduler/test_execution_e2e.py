"""Where batches run, through the daemon: /selection says inline or threaded with the measurements
that decided it, and answers are right either way (concurrent requests, batched)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.http as triton

from tests.builders import affine_model, write_model
from tests.http_util import call

CONFIG = "max_batch_size: 8\ndynamic_batching { }\n"


def _execution(daemon, model: str) -> dict:
    status, _, payload = call(daemon.port, "GET", f"/v2/models/{model}/selection")
    assert status == 200, payload
    return payload["execution"]


def _infer_many(daemon) -> None:
    def one(i: int) -> None:
        with triton.InferenceServerClient(daemon.url) as client:
            x = np.full((1, 8), float(i), np.float32)
            tensor = triton.InferInput("x", [1, 8], "FP32")
            tensor.set_data_from_numpy(x)
            np.testing.assert_allclose(client.infer("affine", [tensor]).as_numpy("y"), x * 2 + 1)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(64)))


def test_a_measured_plan_says_where_it_runs(start_daemon, tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "affine", affine_model(2.0, 1.0), config=CONFIG)
    daemon = start_daemon(repo, selection=True, env={"APPLIANCE_TUNE_BUDGET": "0.05"})
    execution = _execution(daemon, "affine")
    assert execution["hop_us"] > 0 and execution["budget_us"] == 200.0
    assert execution["batch_us"] is not None
    faster = execution["batch_us"] < min(execution["hop_us"], execution["budget_us"])
    assert execution["execution"] == ("inline" if faster else "threaded"), execution
    assert "thread hop" in daemon.log()
    _infer_many(daemon)
    after = _execution(daemon, "affine")
    assert after["inline_max_batch"] <= (8 if faster else 0)


def test_an_unmeasured_plan_runs_threaded(start_daemon, tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "affine", affine_model(2.0, 1.0), config=CONFIG)
    daemon = start_daemon(repo)  # selection off: nothing measured the batch
    execution = _execution(daemon, "affine")
    assert execution["execution"] == "threaded" and "not measured" in execution["reason"]
    assert execution["inline_max_batch"] == 0
    _infer_many(daemon)
