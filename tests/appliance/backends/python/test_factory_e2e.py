"""Through the daemon: which process runs a Python model is the daemon's decision, never the config's. A
config that names the in-process plan's old marker (``parameters python_plan: in-process``), dropped in
the repository or pushed through the load API, is served by a model process all the same when the
operator did not allow the in-process plan (``parameters in_process``): model.py never runs in the daemon,
so an ``os._exit`` there could not take the daemon down."""

from __future__ import annotations

import json

import pytest

from tests.http_util import call
from tests.models import copy_model

MODEL = "backends/pid"
"""Answers with the id of the process it runs in; its config "marker" names the old in-process marker."""


def _pid(port: int, model: str) -> int:
    body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    status, _, answer = call(port, "POST", f"/v2/models/{model}/infer", body)
    assert status == 200, answer
    (output,) = answer["outputs"]
    return int(output["data"][0])


@pytest.fixture(scope="module")
def box(module_daemon, tmp_path_factory):
    """A daemon as users run it (selection on), whose configs do not allow the in-process plan."""
    repo = tmp_path_factory.mktemp("factory") / "repo"
    copy_model(repo, MODEL, "dropped", config="marker")
    copy_model(repo, MODEL, "pushed")
    return module_daemon(repo, "--model-control-mode", "explicit", "--load-model", "*", selection=True)


def test_a_config_in_the_repository_cannot_put_model_py_in_the_daemon(box):
    assert _pid(box.port, "dropped") != box.process.pid
    assert "parameters python_plan" in box.log()  # the ignored marker is named in the log


def test_a_config_pushed_through_the_load_api_cannot_put_model_py_in_the_daemon(box):
    config = {"backend": "python", "max_batch_size": 0,
              "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [1]}],
              "output": [{"name": "PID", "data_type": "TYPE_INT64", "dims": [1]}],
              "parameters": {"python_plan": {"string_value": "in-process"}}}
    status, _, answer = call(box.port, "POST", "/v2/repository/models/pushed/load",
                             {"parameters": {"config": json.dumps(config)}})
    assert status == 200, answer
    assert _pid(box.port, "pushed") != box.process.pid
    assert box.process.poll() is None
