"""What the daemon checks of a Python model's own environment before it starts a model process in it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends.base import LoadContext, RuntimeOptions
from appliance.backends.python.environment import model_environment
from appliance.core.errors import ConfigError


def _context(model_dir: Path, value: str) -> LoadContext:
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    config = mc.ModelConfig(name=model_dir.name, backend="python")
    config.parameters["EXECUTION_ENV_PATH"].string_value = value
    return LoadContext(model_dir.name, 1, model_dir / "1" / "model.py", config, RuntimeOptions())


def test_no_parameter_is_the_daemons_own_python(tmp_path):
    context = _context(tmp_path / "m", "x")
    del context.config.parameters["EXECUTION_ENV_PATH"]
    assert model_environment(context, tmp_path / "root") is None


def test_an_environment_without_numpy_says_so(tmp_path):
    model = tmp_path / "m"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(model / "venv")], check=True)
    with pytest.raises(ConfigError, match="has no numpy"):
        model_environment(_context(model, "$$TRITON_MODEL_DIRECTORY/venv"), tmp_path / "root")


def test_another_python_version_is_refused_naming_both(tmp_path):
    model = tmp_path / "m"
    python = model / "env" / "bin" / "python3"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\necho 3.9\necho 1.26.4\n")  # what a Python 3.9 environment answers the probe
    python.chmod(0o755)
    wanted = f"{sys.version_info[0]}.{sys.version_info[1]}"
    with pytest.raises(ConfigError, match=f"holds Python 3.9, the daemon runs Python {wanted}"):
        model_environment(_context(model, "$$TRITON_MODEL_DIRECTORY/env"), tmp_path / "root")


@pytest.mark.parametrize("value, words", [
    ("$$TRITON_MODEL_DIRECTORY/missing.tar.gz", "does not exist"),
    ("$$TRITON_MODEL_DIRECTORY/../other/env.tar.gz", "outside the model's directory"),
    ("/usr", "outside the model's directory"),
])
def test_paths_stay_inside_the_model_directory(tmp_path, value, words):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "env.tar.gz").write_bytes(b"")
    with pytest.raises(ConfigError, match=words):
        model_environment(_context(tmp_path / "m", value), tmp_path / "root")
