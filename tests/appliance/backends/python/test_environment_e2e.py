"""Triton's EXECUTION_ENV_PATH end to end: a venv holding numpy and a package the daemon's venv lacks,
packed as venv-pack lays it out (a tar.gz of the environment's tree) or used as a directory, and models
that import that package, served by a daemon and called with tritonclient."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.http_util import call
from tests.models import copy_model

GREETING = "hello from the model's own environment"
MODEL = "backends/envonly"
"""Imports envonly_pkg, which the daemon's venv lacks; TEXT is its greeting and sys.prefix."""


def _model(repo: Path, name: str, environment: str | None) -> None:
    """``repo/name`` serving MODEL, with ``environment`` as its EXECUTION_ENV_PATH (none if None)."""
    copy_model(repo, MODEL, name)
    if environment is not None:
        with (repo / name / "config.pbtxt").open("a") as config:
            config.write(f'parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{environment}" }} }}\n')


@pytest.fixture(scope="module")
def environment(tmp_path_factory) -> Path:
    """A venv of the daemon's Python with numpy (copied from the daemon's, so nothing downloads) and
    envonly_pkg, which the daemon's venv lacks."""
    env = tmp_path_factory.mktemp("env") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = env / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    source = Path(np.__file__).resolve().parent.parent
    for name in ("numpy", "numpy.libs"):
        if (source / name).exists():
            subprocess.run(["cp", "-a", str(source / name), str(site / name)], check=True)
    (site / "envonly_pkg").mkdir()
    (site / "envonly_pkg" / "__init__.py").write_text(f"def greeting():\n    return {GREETING!r}\n")
    return env


def _pack(environment: Path, archive: Path) -> None:
    with tarfile.open(archive, "w:gz", compresslevel=1) as packed:  # venv-pack's layout: the tree at the root
        for path in sorted(environment.rglob("*")):
            if "__pycache__" not in path.parts:
                packed.add(path, arcname=str(path.relative_to(environment)), recursive=False)


@pytest.fixture(scope="module")
def repository(tmp_path_factory, environment) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    _model(repo, "packed", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    _pack(environment, repo / "packed" / "env.tar.gz")
    _model(repo, "in_place", "$$TRITON_MODEL_DIRECTORY/venv")
    subprocess.run(["cp", "-a", str(environment), str(repo / "in_place" / "venv")], check=True)
    _model(repo, "broken", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    whole = (repo / "packed" / "env.tar.gz").read_bytes()
    (repo / "broken" / "env.tar.gz").write_bytes(whole[: len(whole) // 3])
    _model(repo, "outside", str(environment))
    _model(repo, "without", None)
    return repo


@pytest.fixture(scope="module")
def daemon(module_daemon, repository):
    return module_daemon(repository, "--model-control-mode", "explicit", "--load-model", "*")


def _infer(daemon, model: str) -> list[str]:
    client = httpclient.InferenceServerClient(daemon.url)
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.zeros(1, np.float32))
    return [item.decode() for item in client.infer(model, [x]).as_numpy("TEXT").reshape(-1)]


def _state(daemon) -> dict[str, dict]:
    _, _, index = call(daemon.port, "POST", "/v2/repository/index", b"{}")
    return {row["name"]: row for row in index}


def test_a_packed_environment_runs_the_model_on_its_own_packages(daemon):
    greeting, prefix = _infer(daemon, "packed")
    assert greeting == GREETING
    unpacked = Path(prefix)
    assert unpacked.parent.name == "environments" and (unpacked / ".unpacked").is_file()  # in the model cache
    assert str(unpacked).startswith(str(Path(daemon.log_path).parent / "cache"))


def test_an_environment_directory_is_used_in_place(daemon, repository):
    greeting, prefix = _infer(daemon, "in_place")
    assert greeting == GREETING and Path(prefix) == (repository / "in_place" / "venv").resolve()


def test_a_model_without_the_environment_cannot_import_its_package(daemon):
    assert _state(daemon)["without"]["state"] == "UNAVAILABLE"
    assert "envonly_pkg" in _state(daemon)["without"]["reason"]


def test_a_broken_archive_is_a_load_error_naming_the_file(daemon, repository):
    row = _state(daemon)["broken"]
    assert row["state"] == "UNAVAILABLE"
    assert str(repository / "broken" / "env.tar.gz") in row["reason"] and "cannot be unpacked" in row["reason"]


def test_an_environment_outside_the_model_directory_is_refused(daemon):
    row = _state(daemon)["outside"]
    assert row["state"] == "UNAVAILABLE" and "outside the model's directory" in row["reason"]


def test_a_reload_reuses_the_unpacked_environment(daemon):
    _, first = _infer(daemon, "packed")
    marker = Path(first) / ".unpacked"
    stamp = marker.stat().st_mtime_ns
    httpclient.InferenceServerClient(daemon.url).load_model("packed")  # a reload: new model processes
    _, again = _infer(daemon, "packed")
    assert again == first and marker.stat().st_mtime_ns == stamp
