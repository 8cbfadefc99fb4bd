"""A daemon imports onnx only to generate the example repository: serving one (the example, once it is
current, or any other) leaves it out, which saves start-up time and memory."""

from __future__ import annotations

from pathlib import Path

from appliance.examples import build_example_repository, ensure_example_repository


def _onnx_loaded(daemon) -> bool:
    return "onnx_cpp2py_export" in Path(f"/proc/{daemon.process.pid}/maps").read_text()


def test_serving_a_repository_does_not_import_onnx(start_daemon, tmp_path):
    repository = build_example_repository(tmp_path / "repo")
    assert not _onnx_loaded(start_daemon(repository))


def test_serving_the_current_example_repository_does_not_import_onnx(start_daemon, tmp_path):
    state = tmp_path / "state"
    ensure_example_repository(state / "example-repository")  # as a first start leaves it
    assert not _onnx_loaded(start_daemon(None, state=state))
