"""Candidate plans: the ways this box can run a model file (runtime + provider/device + precision, and
on the CPU how many instances with how many threads each)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends.python.environment import ENV_PARAMETER
from appliance.backends.python.factory import IN_PROCESS_PLAN_ID

__all__ = ["DEFAULT_PLAN", "INSTANCE_COUNTS", "IN_PROCESS_PLAN", "Plan", "ProbeView", "enumerate_plans",
           "instance_variants", "offers_in_process"]

DEFAULT_PLAN = "default"
"""The plan id of a model served as its config says (no candidate could be measured)."""
INSTANCE_COUNTS = (1, 2, 4)
"""Instance counts a CPU plan is tried with (up to the box's cores)."""


class ProbeView(Protocol):
    """What selection needs from hardware_probe's report."""

    def onnxruntime_providers(self) -> list[str]: ...
    def openvino_devices(self) -> list[str]: ...
    def torch_cuda(self) -> bool: ...
    def tensorrt_version(self) -> str | None: ...


@dataclasses.dataclass(frozen=True)
class Plan:
    """One way to run a model: a backend plus the config parameters that steer it. Its instances are loaded
    with its ``id`` as ``LoadContext.plan`` too: a plan that changes what the daemon trusts is recognised
    by that alone and sets no parameter, since a config can set every parameter itself."""

    id: str
    backend: str
    parameters: tuple[tuple[str, str], ...] = ()
    """Config parameters (runtime options a user may also set in the config, e.g. a device)."""
    reduced_precision: bool = False
    """bf16/fp16 plans: checked against the looser low-precision tolerance, and only kept when the
    model's tolerance admits them."""
    instances: int = 0
    """Instances to serve with; 0: as the config's instance_group says."""
    threads: int = 0
    """Threads inside one operator, per instance; 0: the box's cores shared among the instances."""

    @property
    def base(self) -> str:
        """The id without its instance variant (``@<instances>x<threads>``)."""
        return self.id.split("@")[0]

    def apply(self, config: mc.ModelConfig) -> mc.ModelConfig:
        """A copy of the config with this plan's parameters set (user parameters otherwise kept) and,
        when the plan says how many instances, one CPU instance group of that count."""
        copy = mc.ModelConfig()
        copy.CopyFrom(config)
        for key, value in self.parameters:
            copy.parameters[key].string_value = value
        if self.instances:
            del copy.instance_group[:]
            copy.instance_group.add(name=config.name, kind=mc.ModelInstanceGroup.KIND_CPU, count=self.instances)
        return copy

    def as_json(self) -> dict[str, Any]:
        return {"plan": self.id, "backend": self.backend, "parameters": dict(self.parameters),
                "reduced_precision": self.reduced_precision, "instances": self.instances, "threads": self.threads}


IN_PROCESS_PLAN = Plan(IN_PROCESS_PLAN_ID, "python")
"""A Python model run inside the daemon (no process hop), for models the operator trusts: offered only
where the config sets parameters in_process (see appliance.backends.python.in_process). It sets no config
parameter: the Python backend knows it by ``LoadContext.plan`` alone (appliance.backends.python.factory)."""


def offers_in_process(config: mc.ModelConfig) -> bool:
    """Whether the operator allows the in-process plan for this Python model (not for decoupled ones)."""
    value = config.parameters.get("in_process")
    allowed = value is not None and value.string_value.strip().lower() in ("1", "true", "yes")
    # A model with an environment of its own (EXECUTION_ENV_PATH) runs on that environment's Python.
    return allowed and not config.model_transaction_policy.decoupled and ENV_PARAMETER not in config.parameters


def _on_cpu(plan: Plan) -> bool:
    return plan.id.split(":")[1:2] in (["CPU"], ["cpu"])


def instance_variants(plans: Sequence[Plan], cores: int, threads: int = 0) -> list[Plan]:
    """Each CPU plan as n instances of cores // n threads (or ``threads`` when the settings fix it) for
    n in INSTANCE_COUNTS up to ``cores``; other plans as they are (their instances follow the config)."""
    variants = []
    for plan in plans:
        if not _on_cpu(plan):
            variants.append(plan)
            continue
        for count in (n for n in INSTANCE_COUNTS if n <= max(cores, 1)):
            per_instance = threads or max(1, cores // count)
            variants.append(dataclasses.replace(plan, id=f"{plan.base}@{count}x{per_instance}", instances=count,
                                                threads=per_instance))
    return variants


def _openvino_plans(devices: Sequence[str], bf16: bool) -> list[Plan]:
    plans = [Plan(f"openvino:{d}", "openvino", (("device", d),)) for d in devices]
    if bf16 and "CPU" in devices:
        plans.append(Plan("openvino:CPU:bf16", "openvino", (("device", "CPU"), ("inference_precision", "bf16")),
                          reduced_precision=True))
    return plans


def _onnx_plans(probe: ProbeView, bf16: bool) -> list[Plan]:
    providers = probe.onnxruntime_providers()
    plans = [Plan("onnxruntime:CPU", "onnxruntime", (("onnx_provider", "CPUExecutionProvider"),))]
    if "OpenVINOExecutionProvider" in providers:
        for device in probe.openvino_devices() or ["CPU"]:
            plans.append(Plan(f"onnxruntime+openvino:{device}", "onnxruntime", (
                ("onnx_provider", "OpenVINOExecutionProvider"), ("onnx_provider_device", device))))
    if "CUDAExecutionProvider" in providers:
        plans.append(Plan("onnxruntime:CUDA", "onnxruntime", (("onnx_provider", "CUDAExecutionProvider"),)))
    if "TensorrtExecutionProvider" in providers:
        plans.append(Plan("onnxruntime:TensorRT", "onnxruntime", (("onnx_provider", "TensorrtExecutionProvider"),)))
    # Native OpenVINO reads ONNX directly.
    plans += _openvino_plans(probe.openvino_devices(), bf16)
    return plans


def enumerate_plans(backend: str, probe: ProbeView, cpu_flags: Sequence[str] = ()) -> list[Plan]:
    """Every plan that can run a file of ``backend``'s kind here; the first is the fp32 CPU reference."""
    bf16 = any(flag in cpu_flags for flag in ("avx512_bf16", "amx_bf16"))
    if backend == "onnxruntime":
        return _onnx_plans(probe, bf16)
    if backend == "openvino":
        return _openvino_plans(probe.openvino_devices() or ["CPU"], bf16)
    if backend in ("pytorch", "torch_export"):
        plans = [Plan(f"{backend}:cpu", backend, (("device", "cpu"),))]
        if probe.torch_cuda():
            plans.append(Plan(f"{backend}:cuda", backend, (("device", "cuda"),)))
        return plans
    return [Plan(backend, backend)]  # python, tensorrt: one way to run them
