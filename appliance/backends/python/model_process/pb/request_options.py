"""What a BLS request may carry besides its tensors, under Triton's names: where its outputs should live
(``PreferredMemory``) and the trace it belongs to (``InferenceTrace``)."""

from __future__ import annotations

import enum

__all__ = ["TRITONSERVER_MEMORY_CPU", "TRITONSERVER_MEMORY_GPU", "InferenceTrace", "MemoryType", "PreferredMemory"]


class MemoryType(enum.IntEnum):
    """Triton's ``pb_utils.MemoryType`` (its values exported to the module as in Triton's stub)."""

    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU
_DEFAULT = 2  # Triton's kDefault: where the called model puts its outputs


class PreferredMemory:
    """Where a BLS call would like its outputs. A hint, as in Triton: this appliance's BLS outputs are in
    CPU memory (numpy arrays) whatever it says, and a GPU preference costs nothing."""

    __slots__ = ("preferred_device_id", "preferred_memory_type")

    def __init__(self, preferred_memory_type: MemoryType | int, preferred_device_id: int = 0) -> None:
        if preferred_memory_type is None or preferred_device_id is None:
            raise TypeError("PreferredMemory takes a memory type and a device id, not None")
        self.preferred_memory_type = int(preferred_memory_type)
        self.preferred_device_id = int(preferred_device_id)

    @classmethod
    def default(cls) -> PreferredMemory:
        return cls(_DEFAULT, 0)

    def __repr__(self) -> str:
        return f"PreferredMemory({self.preferred_memory_type}, {self.preferred_device_id})"


class InferenceTrace:
    """The trace a request belongs to; ``get_context()`` is its OpenTelemetry context as text, or None when
    the request is not traced that way (always None here: model processes get no trace context)."""

    __slots__ = ("_context",)

    def __init__(self, context: str | None = None) -> None:
        self._context = context or None

    def get_context(self) -> str | None:
        return self._context
