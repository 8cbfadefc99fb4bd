"""CUDA shared memory: device buffers that clients on this host export as CUDA IPC handles
(``tritonclient.utils.cuda_shared_memory``) and register by name.

The handle is opened with cuda-python (the nvidia flavour); inputs are copied from the device into
host arrays before the request is scheduled, and outputs are copied to the device once it has run.
The size is checked against the allocation the handle opens (``cuMemGetAddressRange``), so a
client cannot register more than it exported. Where CUDA cannot work (no cuda-python, no NVIDIA
driver, Jetson, which has no CUDA IPC) registering answers NotSupported and says why; status and
unregister still answer (with nothing registered), as Triton built without GPUs does.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import threading
from pathlib import Path
from typing import Any

import numpy as np

from appliance.core.errors import InferenceFailed, InvalidInput, NotSupported
from appliance.protocol.shared_memory.table import RegionKind, RegionTable, check_region_name, check_register_integer

__all__ = ["CUDA_IPC_HANDLE_SIZE", "CudaIpc", "CudaRegion", "CudaSharedMemory"]

CUDA_IPC_HANDLE_SIZE = 64
_DRIVER_NODE = Path("/dev/nvidiactl")


def _runtime_modules() -> tuple[Any, Any]:
    """cuda-python's runtime and driver modules (12.x names, or 13's ``cuda.bindings``)."""
    try:
        return importlib.import_module("cuda.bindings.runtime"), importlib.import_module("cuda.bindings.driver")
    except ImportError:
        return importlib.import_module("cuda.cudart"), importlib.import_module("cuda.cuda")


def _check(result: Any, what: str) -> Any:
    """cuda-python returns (error, *values): the values, or InferenceFailed naming the error."""
    error, *values = result if isinstance(result, tuple) else (result,)
    code: Any = getattr(error, "value", error)
    if int(code) != 0:
        raise InferenceFailed(f"CUDA: {what} failed ({getattr(error, 'name', error)})")
    return values[0] if len(values) == 1 else values


class CudaIpc:
    """The few CUDA calls CUDA shared memory needs, loaded on first use (never at import: a daemon
    that serves no CUDA region never initialises CUDA)."""

    def __init__(self, driver_node: Path = _DRIVER_NODE) -> None:
        self._driver_node = driver_node
        self._modules: tuple[Any, Any] | None = None
        self._lock = threading.Lock()

    def unavailable(self) -> str | None:
        """Why CUDA shared memory cannot work on this box, or None. Cheap: imports nothing."""
        try:
            found = importlib.util.find_spec("cuda.bindings") or importlib.util.find_spec("cuda.cudart")
        except ImportError:
            found = None
        if found is None:
            return "cuda-python is not installed (install the nvidia flavour: pip install 'edge-appliance[nvidia]')"
        if not self._driver_node.exists():
            return f"no NVIDIA GPU driver is loaded on this box ({self._driver_node} is missing)"
        return None

    def _load(self) -> tuple[Any, Any]:
        with self._lock:
            if self._modules is None:
                self._modules = _runtime_modules()
            return self._modules

    def open(self, handle: bytes, device_id: int, byte_size: int, region: str) -> CudaRegion:
        runtime, driver = self._load()
        _check(runtime.cudaSetDevice(device_id), f"selecting device {device_id}")
        ipc_handle = runtime.cudaIpcMemHandle_t()
        ctypes.memmove(ipc_handle.getPtr(), handle, CUDA_IPC_HANDLE_SIZE)
        error, pointer = runtime.cudaIpcOpenMemHandle(ipc_handle, runtime.cudaIpcMemLazyEnablePeerAccess)
        if int(getattr(error, "value", error)) != 0:
            # As Triton: the details stay in the daemon; the client learns its arguments were refused.
            raise InvalidInput(f"failed to register shared memory region '{region}': invalid args (the CUDA IPC "
                               f"handle cannot be opened on device {device_id})")
        pointer = int(pointer)
        try:
            base, size = _check(driver.cuMemGetAddressRange(pointer), "reading the allocation's size")
            available = int(base) + int(size) - pointer
            if byte_size > available:
                raise InvalidInput(f"failed to register shared memory region '{region}': invalid args: byte_size "
                                   f"{byte_size} is larger than the {available} bytes the handle exports")
        except BaseException:
            runtime.cudaIpcCloseMemHandle(pointer)
            raise
        return CudaRegion(self, pointer, device_id, byte_size)

    def copy(self, device_id: int, destination: int, source: int, count: int, to_host: bool) -> None:
        runtime, _ = self._load()
        _check(runtime.cudaSetDevice(device_id), f"selecting device {device_id}")
        kinds = runtime.cudaMemcpyKind
        kind = kinds.cudaMemcpyDeviceToHost if to_host else kinds.cudaMemcpyHostToDevice
        _check(runtime.cudaMemcpy(destination, source, count, kind), "copying shared memory")

    def close(self, device_id: int, pointer: int) -> None:
        runtime, _ = self._load()
        _check(runtime.cudaSetDevice(device_id), f"selecting device {device_id}")
        _check(runtime.cudaIpcCloseMemHandle(pointer), "closing a CUDA IPC handle")


def _address(view: memoryview) -> int:
    return np.frombuffer(view, dtype=np.uint8).ctypes.data


class CudaRegion:
    kind = "cuda"

    def __init__(self, ipc: CudaIpc, pointer: int, device_id: int, byte_size: int) -> None:
        self._ipc, self._pointer, self.device_id, self.byte_size = ipc, pointer, device_id, byte_size

    def read(self, offset: int, out: memoryview) -> None:
        if out.nbytes:
            self._ipc.copy(self.device_id, _address(out), self._pointer + offset, out.nbytes, to_host=True)

    def write(self, offset: int, data: memoryview) -> None:
        if data.nbytes:
            self._ipc.copy(self.device_id, self._pointer + offset, _address(data), data.nbytes, to_host=False)

    def status(self) -> dict[str, Any]:
        return {"device_id": self.device_id, "byte_size": self.byte_size}

    def close(self) -> None:
        self._ipc.close(self.device_id, self._pointer)


class CudaSharedMemory(RegionKind):
    """The CUDA shared-memory API (Triton's cudasharedmemory extension)."""

    kind = "cuda"

    def __init__(self, table: RegionTable, ipc: CudaIpc) -> None:
        super().__init__(table)
        self._ipc = ipc

    @property
    def enabled(self) -> bool:
        """Whether registering can work here (the server metadata lists the extension only then)."""
        return self._table.enabled and self._ipc.unavailable() is None

    def register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int, *, local: bool) -> None:
        """``raw_handle``: the 64 bytes of a cudaIpcMemHandle_t (HTTP clients send them base64-encoded)."""
        self._table.check_client(local)
        name = check_region_name(name)
        reason = self._ipc.unavailable()
        if reason is not None:
            raise NotSupported(
                f"failed to register CUDA shared memory region '{name}': CUDA shared memory needs an NVIDIA GPU "
                f"and the appliance's nvidia flavour, and {reason}; use system shared memory instead"
            )
        if not isinstance(raw_handle, (bytes, bytearray)) or len(raw_handle) != CUDA_IPC_HANDLE_SIZE:
            raise InvalidInput(
                f"failed to register shared memory region '{name}': the raw handle must be the "
                f"{CUDA_IPC_HANDLE_SIZE} bytes of a cudaIpcMemHandle_t"
            )
        device_id = check_register_integer(device_id, "device_id", name, 0)
        byte_size = check_register_integer(byte_size, "byte_size", name, 1)
        handle = bytes(raw_handle)
        self._table.add(name, byte_size, lambda: self._ipc.open(handle, device_id, byte_size, name))
