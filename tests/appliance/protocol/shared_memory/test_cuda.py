"""CUDA shared memory: a clear refusal where CUDA cannot work; on an NVIDIA GPU with cuda-python (the
nvidia flavour), a region registered from a real IPC handle, read and written (bench/gpu_checks.sh)."""

from __future__ import annotations

import base64
import subprocess
import sys

import numpy as np
import pytest

from appliance.core.errors import Forbidden, InvalidInput, NotSupported
from appliance.engine.types import (
    InferOutput,
    InferRequest,
    InferResponse,
    RequestedOutput,
    SharedMemoryInput,
    SharedMemoryRef,
)
from appliance.protocol.shared_memory import CudaIpc, LocalPeers, SharedMemoryLimits, SharedMemoryRegistry


def _registry(ipc: CudaIpc, client_shm: str = "local") -> SharedMemoryRegistry:
    return SharedMemoryRegistry(client_shm, SharedMemoryLimits(), LocalPeers(["127.0.0.0/8"]), cuda=ipc)


def test_without_a_gpu_driver_registration_says_what_is_needed(tmp_path):
    shm = _registry(CudaIpc(driver_node=tmp_path / "nvidiactl"))  # a box without the NVIDIA driver
    with pytest.raises(NotSupported) as caught:
        shm.cuda.register("gpu", bytes(64), 0, 1024, local=True)
    message = caught.value.message
    assert "needs an NVIDIA GPU" in message and "nvidia flavour" in message and "system shared memory" in message
    assert ("nvidiactl" in message) or ("cuda-python is not installed" in message)
    # Status and unregister answer as Triton without GPUs does: nothing is registered.
    assert shm.cuda.status(local=True) == []
    shm.cuda.unregister(local=True)
    assert shm.extensions() == ["system_shared_memory"]
    with pytest.raises(Forbidden):
        shm.cuda.unregister(local=False)


def _gpu_reason() -> str | None:
    reason = CudaIpc().unavailable()
    if reason is not None:
        return reason
    try:
        import tritonclient.utils.cuda_shared_memory  # noqa: F401 - needs cuda-python too
    except Exception as exc:  # noqa: BLE001
        return f"tritonclient's CUDA helpers do not load: {exc}"
    return None


def gpu(test):
    """Marks a test as needing a GPU (``-m "not gpu"``) and skips it, with the reason, where none is."""
    reason = _gpu_reason()
    return pytest.mark.gpu(pytest.mark.skipif(reason is not None, reason=f"CUDA shared memory: {reason}")(test))


# CUDA IPC handles open only in another process than the one that exported them: the client runs apart.
_CLIENT = """
import base64, sys
import numpy as np
import tritonclient.utils.cuda_shared_memory as cudashm
handle = cudashm.create_shared_memory_region("gpu", 128, 0)
cudashm.set_shared_memory_region(handle, [np.arange(16, dtype=np.float32)])
print(cudashm.get_raw_handle(handle).decode(), flush=True)
sys.stdin.readline()
print(" ".join(str(v) for v in cudashm.get_contents_as_numpy(handle, np.float32, [32])[16:]), flush=True)
cudashm.destroy_shared_memory_region(handle)
"""


@gpu
async def test_a_cuda_region_is_read_and_written():
    client = subprocess.Popen([sys.executable, "-c", _CLIENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    shm = _registry(CudaIpc())
    try:
        assert "cuda_shared_memory" in shm.extensions()
        raw = base64.b64decode(client.stdout.readline().strip())
        with pytest.raises(InvalidInput, match="invalid args"):
            shm.cuda.register("too-big", raw, 0, 1 << 30, local=True)
        shm.cuda.register("gpu", raw, 0, 128, local=True)
        assert shm.cuda.status(local=True) == [{"name": "gpu", "device_id": 0, "byte_size": 128}]
        x = np.arange(16, dtype=np.float32)
        request = InferRequest([], [RequestedOutput("y", shared_memory=SharedMemoryRef("gpu", 64, 64))],
                               shared_inputs=[SharedMemoryInput("x", "FP32", (16,), SharedMemoryRef("gpu", 64))])
        with await shm.bind(request, local=True, reserve=lambda size: None) as binding:
            np.testing.assert_array_equal(request.inputs[0].data, x)
            await binding.write(InferResponse("m", 1, [InferOutput("y", "FP32", x * 3)]))
        shm.cuda.unregister(local=True)
        assert shm.cuda.status(local=True) == []
        client.stdin.write("\n")
        client.stdin.flush()
        assert [float(v) for v in client.stdout.readline().split()] == list(x * 3)
    finally:
        shm.close()
        client.kill()
        client.wait()
