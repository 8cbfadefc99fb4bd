"""Shared by the TorchScript and torch.export backends: dtypes, devices, tensors in and out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from appliance.backends.base import LoadContext
from appliance.core.errors import ConfigError
from appliance.core.tensors import bf16, is_bf16

__all__ = ["TORCH_TO_V2", "outputs_by_name", "prepare_torch", "to_numpy", "to_torch"]

TORCH_TO_V2 = {
    torch.bool: "BOOL",
    torch.uint8: "UINT8",
    torch.uint16: "UINT16",
    torch.uint32: "UINT32",
    torch.uint64: "UINT64",
    torch.int8: "INT8",
    torch.int16: "INT16",
    torch.int32: "INT32",
    torch.int64: "INT64",
    torch.float16: "FP16",
    torch.float32: "FP32",
    torch.float64: "FP64",
    torch.bfloat16: "BF16",
}


def prepare_torch(context: LoadContext) -> torch.device:
    """Config parameter ``device`` ("cpu", "cuda:0"), else CUDA for a KIND_GPU group when present; torch's
    CPU threads set to the instance's share (``context.threads``) when it has one."""
    if context.threads:
        torch.set_num_threads(context.threads)
    parameter = context.config.parameters.get("device")
    wanted = parameter.string_value if parameter is not None and parameter.string_value else ""
    if not wanted:
        gpu_group = any(group.kind == 2 for group in context.config.instance_group)  # KIND_GPU
        wanted = "cuda" if gpu_group and torch.cuda.is_available() else "cpu"
    device = torch.device(wanted)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"model {context.model_name!r} asks for device {wanted!r}, but torch sees no CUDA GPU")
    return device


def to_torch(array: np.ndarray, device: torch.device) -> torch.Tensor:
    if array.dtype == object:
        raise ConfigError("BYTES tensors are not supported by the torch backends")
    if not array.flags.writeable:  # torch wants to own writable memory; binary inputs are read-only views
        array = array.copy()
    if is_bf16(array.dtype):  # numpy's bfloat16 is ml_dtypes': hand torch the same 16-bit words
        return torch.from_numpy(np.ascontiguousarray(array).view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(array).to(device)


def to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:
            return value.contiguous().view(torch.int16).numpy().view(bf16())
        return value.numpy()
    return np.asarray(value)


def outputs_by_name(result: Any, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Map a forward result to output names: a dict by key, a tuple/list by position (Triton's
    OUTPUT__<i> naming, else the config's order), a single tensor to the first name."""
    if isinstance(result, Mapping):
        return {str(k): to_numpy(v) for k, v in result.items()}
    items = list(result) if isinstance(result, (tuple, list)) else [result]
    mapped: dict[str, np.ndarray] = {}
    for position, name in enumerate(names):
        index = int(name.rsplit("__", 1)[1]) if "__" in name and name.rsplit("__", 1)[1].isdigit() else position
        if index < len(items):
            mapped[name] = to_numpy(items[index])
    return mapped


def argument_index(name: str, argument_names: Sequence[str]) -> int:
    """Triton's convention: INPUT__<i> is positional argument i; otherwise the forward argument name."""
    suffix = name.rsplit("__", 1)[-1]
    if "__" in name and suffix.isdigit():
        return int(suffix)
    if name in argument_names:
        return list(argument_names).index(name)
    raise ConfigError(
        f"input {name!r} matches no forward() argument; name inputs INPUT__0, INPUT__1, ... "
        f"or after the arguments {list(argument_names)}"
    )
