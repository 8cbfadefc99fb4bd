"""The KServe manifests under images/kserve/ parse, and carry what KServe requires of a ServingRuntime and
an InferenceService (no cluster runs here: the fields KServe's controllers read are checked instead)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from appliance.cli import _parser

KSERVE = Path(__file__).resolve().parents[2] / "images" / "kserve"


def _documents() -> dict[str, dict]:
    found = {}
    for path in sorted(KSERVE.glob("*.yaml")):
        (document,) = list(yaml.safe_load_all(path.read_text()))
        found[path.name] = document
    return found


@pytest.fixture(scope="module")
def manifests() -> dict[str, dict]:
    return _documents()


def _runtime(manifests: dict[str, dict]) -> dict:
    (runtime,) = [d for d in manifests.values() if d["kind"] == "ServingRuntime"]
    return runtime


def test_every_manifest_is_one_kserve_object(manifests):
    assert set(manifests) == {"servingruntime-appliance.yaml", "inferenceservice-appliance.yaml",
                              "inferenceservice-triton.yaml"}
    for document in manifests.values():
        assert document["apiVersion"].startswith("serving.kserve.io/")
        assert document["metadata"]["name"]


def test_the_serving_runtime_has_what_kserve_requires(manifests):
    runtime = _runtime(manifests)
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
    spec = runtime["spec"]
    formats = {f["name"]: f for f in spec["supportedModelFormats"]}
    assert set(formats) == {"onnx", "openvino", "pytorch", "triton"}
    for model_format in formats.values():
        assert isinstance(model_format["version"], str) and model_format["version"]
        assert isinstance(model_format["autoSelect"], bool)
    assert "v2" in spec["protocolVersions"]
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"  # the name KServe injects the model into
    assert container["image"]
    assert container["ports"] and all(isinstance(p["containerPort"], int) for p in container["ports"])
    http_port = container["ports"][0]["containerPort"]
    assert f"--http-port={http_port}" in container["args"]
    assert "--model-repository=/mnt/models" in container["args"]  # where KServe puts storageUri
    mounts = {m["name"] for m in container.get("volumeMounts", [])}
    assert mounts <= {v["name"] for v in spec.get("volumes", [])}


def test_the_runtime_arguments_are_the_daemons_own(manifests):
    container = _runtime(manifests)["spec"]["containers"][0]
    assert container["command"] == ["appliance"]
    args = _parser().parse_args(container["args"])  # raises SystemExit on a flag the daemon lacks
    assert args.command == "serve" and args.mdns is False and str(args.model_repository) == "/mnt/models"


@pytest.mark.parametrize("name, runtime, model_format", [
    ("inferenceservice-appliance.yaml", "appliance", "onnx"),
    ("inferenceservice-triton.yaml", "kserve-tritonserver", "triton"),
])
def test_inference_services_name_their_runtime_format_and_storage(manifests, name, runtime, model_format):
    service = manifests[name]
    assert service["apiVersion"] == "serving.kserve.io/v1beta1" and service["kind"] == "InferenceService"
    model = service["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == model_format
    assert model["runtime"] == runtime
    assert model["protocolVersion"] == "v2"
    assert "://" in model["storageUri"]
    if runtime == "appliance":  # the runtime serves the format the service asks for
        assert model_format in {f["name"] for f in _runtime(manifests)["spec"]["supportedModelFormats"]}
