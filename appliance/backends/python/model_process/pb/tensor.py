"""``pb_utils.Tensor``: a named numpy array, exchanged with other frameworks through DLPack.

BF16 has no numpy type of its own: a BF16 tensor holds an ``ml_dtypes.bfloat16`` array (the server's
BF16 arrays, see appliance.core.tensors), travels to and from torch through DLPack, and goes to clients and
other models like any tensor; ``as_numpy`` refuses it with Triton's words, as Triton's does.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from appliance.backends.python.model_process.pb.errors import TritonModelException
from appliance.backends.python.model_process.pb.types import BF16_CODE, numpy_to_triton_type
from appliance.core.tensors import bf16 as bf16_dtype
from appliance.core.tensors import is_bf16

__all__ = ["Tensor"]

_DLPACK_CPU = (1, 0)  # (kDLCPU, device 0)
_PLAIN = frozenset("biuf")
"""numpy kinds a tensor holds as they are: numbers and booleans (not strings, objects, BF16's void)."""


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
    return _torch_bf16_array(tensor) if tensor.dtype == torch.bfloat16 else None


def _torch_bf16_array(tensor: Any) -> np.ndarray:
    """A torch.bfloat16 tensor's memory as a BF16 array (no copy when it is contiguous)."""
    import torch

    return tensor.contiguous().view(torch.int16).numpy().view(bf16_dtype())


class Tensor:
    def __init__(self, name: str, data: Any, *, bf16: bool = False) -> None:
        if not isinstance(name, str):
            raise TypeError(f"a Tensor's name must be a string, not {type(name).__name__}")
        if type(data) is np.ndarray and data.dtype.kind in _PLAIN and not bf16:  # the common tensor, at once
            self._name = name
            self._array = data
            self._bf16 = False
            return
        array = data if isinstance(data, np.ndarray) else np.asarray(data)
        if array.dtype.kind in "SU":
            array = np.array([v.encode() if isinstance(v, str) else bytes(v) for v in array.ravel()],
                             dtype=object).reshape(array.shape)
        if bf16 and not is_bf16(array.dtype):  # BF16's 16-bit words, as uint16 or int16
            if array.dtype.itemsize != 2 or array.dtype.kind not in "iu":
                raise TritonModelException(f"tensor '{name}': bf16=True takes 16-bit words (uint16), not {array.dtype}")
            array = array.view(bf16_dtype())
        self._name = name
        self._array = array
        self._bf16 = is_bf16(array.dtype)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if self._bf16:
            raise TritonModelException(
                "Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() and from_dlpack() instead. "
                f"(tensor '{self._name}')"
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
        """The array as stored (BF16 as ``ml_dtypes.bfloat16``)."""
        return self._array

    # -- DLPack --------------------------------------------------------------------------------

    def to_dlpack(self) -> Any:
        """A DLPack capsule sharing this tensor's memory."""
        return self.__dlpack__()

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        if self._bf16:
            import torch  # only a BF16 tensor needs it: numpy cannot describe bfloat16

            words = np.ascontiguousarray(self._array).view(np.int16)
            return torch.utils.dlpack.to_dlpack(torch.from_numpy(words).view(torch.bfloat16))
        if self._array.dtype == object:
            raise TritonModelException(f"tensor '{self._name}' holds BYTES, which DLPack cannot describe")
        return np.ascontiguousarray(self._array).__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return _DLPACK_CPU

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A tensor sharing the memory of a DLPack capsule or of any object with ``__dlpack__``."""
        if _is_torch_bf16(capsule):
            return Tensor(name, _torch_bf16_array(capsule))
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
                    return Tensor(name, words)
            raise TritonModelException(f"cannot make tensor '{name}' from DLPack: {exc}") from exc
