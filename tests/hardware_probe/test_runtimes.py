"""Runtimes installed here: onnxruntime, OpenVINO and torch for CPU; no TensorRT."""

from __future__ import annotations

import pytest

from hardware_probe.runtimes import probe_runtimes


@pytest.fixture(scope="module")
def runtimes() -> dict:
    return probe_runtimes()


def test_onnxruntime_loads_the_cpu_provider_and_skips_azure(runtimes: dict) -> None:
    onnxruntime = runtimes["onnxruntime"]
    assert onnxruntime["status"] == "present"
    assert "CPUExecutionProvider" in onnxruntime["loadable_providers"]
    assert "AzureExecutionProvider" not in onnxruntime["loadable_providers"]
    assert set(onnxruntime["loadable_providers"]) <= set(onnxruntime["available_providers"])


def test_openvino_offers_the_cpu(runtimes: dict) -> None:
    assert runtimes["openvino"]["status"] == "present"
    assert "CPU" in runtimes["openvino"]["devices"]


def test_torch_is_a_cpu_build(runtimes: dict) -> None:
    torch = runtimes["torch"]
    assert torch["status"] == "present"
    assert torch["cuda_available"] is False
    assert torch["cuda_devices"] == []


def test_a_missing_runtime_is_absent_alone(runtimes: dict) -> None:
    assert runtimes["status"] == "present"
    reason = "ModuleNotFoundError: No module named 'tensorrt'"
    assert runtimes["tensorrt"] == {"status": "absent", "reason": reason}
