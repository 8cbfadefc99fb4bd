"""``pb_utils.Tensor``: a named numpy array, exchanged with other frameworks through DLPack.

BF16 has no numpy type: a BF16 tensor keeps its raw 16-bit words (``as_numpy`` refuses it, as in
Triton) and travels to and from torch through DLPack.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from appliance.backends.python.pb.errors import TritonModelException
from appliance.backends.python.pb.types import BF16_CODE, numpy_to_triton_type

__all__ = ["Tensor"]

_DLPACK_CPU = (1, 0)  # (kDLCPU, device 0)


class _Capsule:
    """Gives a bare DLPack PyCapsule the ``__dlpack__`` protocol numpy expects."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return _DLPACK_CPU


def _is_torch_bf16(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor) and obj.dtype == torch.bfloat16


def _from_capsule_bf16(capsule: Any) -> np.ndarray | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        tensor = torch.utils.dlpack.from_dlpack(capsule)
    except Exception:  # noqa: BLE001 - not a capsule torch can read either
        return None
    return tensor.contiguous().view(torch.int16).numpy().view(np.uint16) if tensor.dtype == torch.bfloat16 else None


class Tensor:
    def __init__(self, name: str, data: Any, *, bf16: bool = False) -> None:
        if not isinstance(name, str):
            raise TypeError(f"a Tensor's name must be a string, not {type(name).__name__}")
        array = data if isinstance(data, np.ndarray) else np.asarray(data)
        if array.dtype.kind in "SU":
            array = np.array([v.encode() if isinstance(v, str) else bytes(v) for v in array.ravel()],
                             dtype=object).reshape(array.shape)
        self._name = name
        self._array = array
        self._bf16 = bf16

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if self._bf16:
            raise TritonModelException(
                f"tensor '{self._name}' is BF16, which numpy has no type for; use Tensor.to_dlpack() and "
                "torch.utils.dlpack.from_dlpack() to read it"
            )
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def triton_dtype(self) -> int | None:
        return BF16_CODE if self._bf16 else numpy_to_triton_type(self._array.dtype)

    @property
    def is_bf16(self) -> bool:
        return self._bf16

    def detach(self) -> None:
        """Own its data (a copy) instead of viewing memory the server will reuse."""
        if self._array.base is not None:
            self._array = self._array.copy()

    def raw(self) -> np.ndarray:
        """The array as stored (BF16 as uint16 words)."""
        return self._array

    # -- DLPack --------------------------------------------------------------------------------

    def to_dlpack(self) -> Any:
        """A DLPack capsule sharing this tensor's memory."""
        return self.__dlpack__()

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        if self._bf16:
            import torch  # only a BF16 tensor needs it: numpy cannot describe bfloat16

            return torch.utils.dlpack.to_dlpack(torch.from_numpy(self._array.view(np.int16)).view(torch.bfloat16))
        if self._array.dtype == object:
            raise TritonModelException(f"tensor '{self._name}' holds BYTES, which DLPack cannot describe")
        return np.ascontiguousarray(self._array).__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return _DLPACK_CPU

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A tensor sharing the memory of a DLPack capsule or of any object with ``__dlpack__``."""
        if _is_torch_bf16(capsule):
            import torch

            return Tensor(name, capsule.contiguous().view(torch.int16).numpy().view(np.uint16), bf16=True)
        source = capsule if hasattr(capsule, "__dlpack__") else _Capsule(capsule)
        if hasattr(capsule, "__dlpack_device__") and capsule.__dlpack_device__()[0] != _DLPACK_CPU[0]:
            raise TritonModelException(
                f"tensor '{name}' is on a GPU; this server's Python backend keeps tensors in CPU memory "
                "(move it with .cpu() first)"
            )
        try:
            return Tensor(name, np.from_dlpack(source))
        except (TypeError, BufferError, RuntimeError) as exc:
            if not hasattr(capsule, "__dlpack__"):
                words = _from_capsule_bf16(capsule)
                if words is not None:
                    return Tensor(name, words, bf16=True)
            raise TritonModelException(f"cannot make tensor '{name}' from DLPack: {exc}") from exc
