"""A daemon imports onnx only to generate the example repository: serving one (the example, once it is
current, or any other) leaves it out, which saves start-up time and memory; and the libraries of features
a box does not use (mDNS, the fleet commands, BF16, coroutines in a model) stay out of its processes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from appliance.examples import build_example_repository, ensure_example_repository
from tests.models import copy_model


def _onnx_loaded(daemon) -> bool:
    return "onnx_cpp2py_export" in Path(f"/proc/{daemon.process.pid}/maps").read_text()


def test_serving_a_repository_does_not_import_onnx(start_daemon, tmp_path):
    repository = build_example_repository(tmp_path / "repo")
    assert not _onnx_loaded(start_daemon(repository))


def test_serving_the_current_example_repository_does_not_import_onnx(start_daemon, tmp_path):
    state = tmp_path / "state"
    ensure_example_repository(state / "example-repository")  # as a first start leaves it
    assert not _onnx_loaded(start_daemon(None, state=state))


# What only some boxes use stays out of the processes of the others (issue 39's idle memory, measured by
# bench.triton's idle RSS): each is named by a native library of its own, which /proc/<pid>/maps shows.
_OPTIONAL_IN_DAEMON = {
    "zeroconf": "mDNS (off here)",
    "cryptography": "the certificate and fleet commands",
}  # (ml_dtypes is tritonclient's, whose protobuf modules the daemon speaks)
_OPTIONAL_IN_MODEL = {
    "_asyncio": "async execute() and async BLS (this model has neither)",
    "ml_dtypes": "BF16 tensors (none here)",
}


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def _mapped(pid: int, libraries: dict[str, str]) -> list[str]:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return [f"{name} ({why})" for name, why in libraries.items() if f"/{name}" in maps]


def test_a_daemon_and_its_model_processes_load_only_what_they_use(start_daemon, tmp_path):
    repository = tmp_path / "repo"
    copy_model(repository, "front_ends/echo")
    daemon = start_daemon(repository)
    with httpclient.InferenceServerClient(daemon.url) as client:
        tensor = httpclient.InferInput("IN", [2], "FP32")
        tensor.set_data_from_numpy(np.asarray([1, 2], np.float32))
        assert client.infer("echo", [tensor]).as_numpy("OUT").tolist() == [1, 2]
    assert _mapped(daemon.process.pid, _OPTIONAL_IN_DAEMON) == []
    models = [pid for pid in _children(daemon.process.pid)
              if b"model_process" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert models
    for pid in models:
        assert _mapped(pid, _OPTIONAL_IN_MODEL) == []
