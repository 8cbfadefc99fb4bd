"""Backends, one module per runtime. Adding a runtime = one module plus one entry in ``BACKENDS``.

Look a backend up by name with ``named``, or by a model's config and files with ``resolve_backend``.
"""

from __future__ import annotations

from pathlib import Path

from appliance.backends.base import (
    Backend,
    BackendInfo,
    BackendRequest,
    BackendServices,
    BatchResult,
    LoadContext,
    RuntimeOptions,
    threads_per_instance,
    usable_cores,
)
from appliance.core.errors import ConfigError

__all__ = [
    "BACKENDS",
    "Backend",
    "BackendInfo",
    "BackendRequest",
    "BackendServices",
    "BatchResult",
    "LoadContext",
    "RuntimeOptions",
    "named",
    "resolve_backend",
    "threads_per_instance",
    "usable_cores",
]

# name, platforms, default file name, module, factory, extra (the install flavour), then what differs.
BACKENDS: tuple[BackendInfo, ...] = (
    BackendInfo("onnxruntime", ("onnxruntime_onnx",), "model.onnx", "appliance.backends.onnxruntime",
                "OnnxRuntimeBackend", "cpu", cpu_instances=2),
    BackendInfo("openvino", ("openvino",), "model.xml", "appliance.backends.openvino", "OpenVinoBackend", "cpu"),
    BackendInfo("pytorch", ("pytorch_libtorch",), "model.pt", "appliance.backends.torchscript",
                "TorchScriptBackend", "cpu"),
    BackendInfo("torch_export", ("torch_aoti", "torch_export"), "model.pt2", "appliance.backends.torch_export",
                "TorchExportBackend", "cpu"),
    BackendInfo("python", ("python",), "model.py", "appliance.backends.python.factory", "load_python", "cpu",
                decoupled=True, in_process=False),
    # Triton's qa backend: the config is the model (no file), OUTPUT<i> = INPUT<i>
    BackendInfo("identity", ("identity",), "", "appliance.backends.identity", "IdentityBackend", "cpu",
                reads_file=False),
    # a batch waits on the GPU's stream: kept off the event loop
    BackendInfo("tensorrt", ("tensorrt_plan",), "model.plan", "appliance.backends.tensorrt", "TensorRTBackend",
                "nvidia", in_process=False),
)


def named(name: str) -> BackendInfo:
    """The backend registered as ``name`` (a plan's or a cached decision's ``backend``)."""
    for info in BACKENDS:
        if info.name == name:
            return info
    raise ConfigError(f"unknown backend {name!r}; known: {', '.join(info.name for info in BACKENDS)}")


def resolve_backend(model_name: str, backend: str, platform: str, version_dirs: list[Path]) -> BackendInfo:
    """The backend a model asks for (config ``backend``/``platform``), else the one whose file is there."""
    for info in BACKENDS:
        if (backend and backend == info.name) or (platform and platform in info.platforms):
            return info
    if backend or platform:
        known = ", ".join(sorted({i.name for i in BACKENDS} | {p for i in BACKENDS for p in i.platforms}))
        raise ConfigError(
            f"model {model_name!r}: unknown backend/platform {backend or platform!r}; known: {known}"
        )
    for info in BACKENDS:
        if info.reads_file and any((d / info.default_filename).exists() for d in version_dirs):
            return info
    wanted = " or ".join(i.default_filename for i in BACKENDS if i.reads_file)
    raise ConfigError(
        f"model {model_name!r}: cannot tell which backend to use; put {wanted} in a version "
        f"directory (e.g. {model_name}/1/{BACKENDS[0].default_filename}) or set 'backend' in config.pbtxt"
    )
