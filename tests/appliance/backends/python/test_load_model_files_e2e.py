"""``pb_utils.load_model(name, config=..., files=...)`` from a Python model, through a real daemon in
explicit mode: the files are kept as a push over the load API is (under the state dir, never in the
repository), with the same confinement and size bounds, and Triton's words when they cannot be used."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.builders import affine_model
from tests.models import copy_model

LOADER = "backends/loader"
"""Loads the model "tripler" from files, in the way CASE names; RESULT is "ok" or the error's text."""


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("loads")
    model = copy_model(repo, LOADER)
    (model.parent / "tripler.onnx").write_bytes(affine_model(3.0, 0.0).SerializeToString())
    return repo


@pytest.fixture(scope="module")
def daemon(module_daemon, repository, tmp_path_factory):
    state = tmp_path_factory.mktemp("state")
    started = module_daemon(repository, "--model-control-mode", "explicit", "--load-model", "loader",
                            "--push-max-file-bytes", "2048", state=state)
    started.extra["state"] = state
    return started


def _load(client, case: str) -> str:
    tensor = httpclient.InferInput("CASE", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([case.encode()], dtype=object))
    return client.infer("loader", [tensor]).as_numpy("RESULT")[0].decode()


def _index(daemon) -> dict:
    request = urllib.request.Request(f"{daemon.base}/v2/repository/index", data=b"{}", method="POST")
    return {row["name"]: row for row in json.loads(urllib.request.urlopen(request, timeout=10).read())}


def test_a_model_loads_another_from_files(daemon, client, repository):
    assert _load(client, "good") == "ok"
    tensor = httpclient.InferInput("x", [1, 8], "FP32")
    tensor.set_data_from_numpy(np.arange(8, dtype=np.float32).reshape(1, 8))
    np.testing.assert_array_equal(client.infer("tripler", [tensor]).as_numpy("y"), [np.arange(8) * 3])
    row = _index(daemon)["tripler"]
    assert row["state"] == "READY" and row["origin"] == "pushed"
    # Kept as a push is: under the state dir, never in the repository.
    assert not (repository / "tripler").exists()
    assert list((daemon.extra["state"] / "pushed").glob("*/tripler/1/model.onnx"))


@pytest.mark.parametrize("case, words", [
    ("escape", "every part of the path must be a plain name"),
    ("absolute", "must be a version number"),  # 'file:/tmp/...' is the model directory's tmp/, as Triton reads it
    ("no_version", "the pushed files have no version directory"),
    ("no_config", "file overrides need the 'config' parameter"),
])
def test_files_outside_the_rules_are_refused_with_tritons_words(daemon, client, case, words):
    message = _load(client, case)
    assert message.startswith("failed to load 'tripler', failed to poll from model repository: "), message
    assert words in message
    assert not list(daemon.extra["state"].rglob("escape"))


def test_files_over_the_push_bounds_are_refused_before_they_are_copied(daemon, client):
    message = _load(client, "large")
    assert "failed to poll from model repository" in message and "push_max_file_bytes (2048)" in message
