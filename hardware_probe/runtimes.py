"""Which inference runtimes are installed, their versions, and what each can actually run on."""

from __future__ import annotations

from collections.abc import Callable

from hardware_probe.openvino_devices import list_openvino_devices
from hardware_probe.step import RUNTIME_IMPORTS, absent

__all__ = ["probe_runtimes"]

# Listed by get_available_providers() but it calls remote endpoints; it computes nothing here.
_NOT_COMPUTE_PROVIDERS = frozenset({"AzureExecutionProvider"})


def _build_identity_model() -> bytes:
    """The smallest model a provider must accept: Identity on a float [1] tensor."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "hardware_probe_identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model.SerializeToString()


def _try_provider(ort, model: bytes, provider: str) -> str | None:
    """None when `provider` loads, else why not.

    onnxruntime falls back to CPU when a provider cannot start (no CUDA driver, say) instead of
    raising, so the session's first provider is the only honest answer.
    """
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the fallback warning is the expected answer here, not news
    options.intra_op_num_threads = 1
    try:
        session = ort.InferenceSession(model, sess_options=options, providers=[provider])
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    loaded = session.get_providers()
    if not loaded or loaded[0] != provider:
        return f"session fell back to {loaded[0] if loaded else 'nothing'}"
    return None


def _probe_onnxruntime() -> dict:
    import onnxruntime as ort

    model = _build_identity_model()
    available = list(ort.get_available_providers())
    loadable, failures = [], {}
    for provider in available:
        if provider in _NOT_COMPUTE_PROVIDERS:
            continue
        failure = _try_provider(ort, model, provider)
        if failure is None:
            loadable.append(provider)
        else:
            failures[provider] = failure
    return {
        "status": "present",
        "version": ort.__version__,
        "available_providers": available,
        "loadable_providers": loadable,
        "provider_failures": failures,
    }


def _probe_openvino() -> dict:
    import openvino

    devices = list_openvino_devices()
    return {
        "status": "present",
        "version": openvino.__version__,
        "devices": list(devices),
        "device_names": devices,
    }


def _probe_torch() -> dict:
    import torch

    cuda = torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
    devices = [torch.cuda.get_device_name(index) for index in range(count)]
    return {
        "status": "present",
        "version": torch.__version__,
        "cuda_available": cuda,
        "cuda_version": torch.version.cuda,
        "cuda_devices": devices,
    }


def _probe_tensorrt() -> dict:
    import tensorrt

    return {"status": "present", "version": tensorrt.__version__}


_RUNTIMES: dict[str, Callable[[], dict]] = {
    "onnxruntime": _probe_onnxruntime,
    "openvino": _probe_openvino,
    "torch": _probe_torch,
    "tensorrt": _probe_tensorrt,
}


def _probe_one(probe_runtime: Callable[[], dict]) -> dict:
    try:
        with RUNTIME_IMPORTS:
            return probe_runtime()
    except Exception as exc:  # missing or broken, a runtime is absent for itself only, not its neighbours
        return absent(f"{type(exc).__name__}: {exc}")


def probe_runtimes() -> dict:
    """One sub-section per runtime, each with its own status; runtimes are imported only here."""
    return {"status": "present", **{name: _probe_one(run) for name, run in _RUNTIMES.items()}}
