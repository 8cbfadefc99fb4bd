"""CUDA shared memory end to end through tritonclient, on a box with an NVIDIA GPU and the nvidia flavour
(cuda-python): skipped elsewhere; bench/gpu_checks.sh runs it."""

from __future__ import annotations

import numpy as np
import pytest

from appliance.examples import build_example_repository
from appliance.protocol.shared_memory import CudaIpc


def _reason() -> str | None:
    reason = CudaIpc().unavailable()
    if reason is None:
        try:
            import tritonclient.utils.cuda_shared_memory  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - whatever keeps the client's helpers from loading
            reason = f"tritonclient's CUDA helpers do not load: {exc}"
    return reason


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(_reason() is not None, reason=f"CUDA shared memory: {_reason()}")]


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return build_example_repository(tmp_path_factory.mktemp("cuda") / "repo")


def test_inputs_and_outputs_in_cuda_shared_memory(client):
    import tritonclient.http as triton
    import tritonclient.utils.cuda_shared_memory as cudashm

    assert "cuda_shared_memory" in client.get_server_metadata()["extensions"]
    x, y = np.arange(16, dtype=np.int32).reshape(1, 16), np.full((1, 16), 2, dtype=np.int32)
    inputs_handle = cudashm.create_shared_memory_region("in", 128, 0)
    outputs_handle = cudashm.create_shared_memory_region("out", 128, 0)
    try:
        cudashm.set_shared_memory_region(inputs_handle, [x, y])
        client.register_cuda_shared_memory("in", cudashm.get_raw_handle(inputs_handle), 0, 128)
        client.register_cuda_shared_memory("out", cudashm.get_raw_handle(outputs_handle), 0, 128)
        assert {r["name"] for r in client.get_cuda_shared_memory_status()} == {"in", "out"}
        inputs = [triton.InferInput("INPUT0", [1, 16], "INT32"), triton.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory("in", 64)
        inputs[1].set_shared_memory("in", 64, offset=64)
        outputs = [triton.InferRequestedOutput("OUTPUT0"), triton.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("out", 64)
        outputs[1].set_shared_memory("out", 64, offset=64)
        client.infer("simple", inputs, outputs=outputs)
        result = cudashm.get_contents_as_numpy(outputs_handle, np.int32, [2, 16])
        np.testing.assert_array_equal(result[0], (x + y)[0])
        np.testing.assert_array_equal(result[1], (x - y)[0])
        with pytest.raises(Exception, match="invalid args"):
            client.register_cuda_shared_memory("huge", cudashm.get_raw_handle(inputs_handle), 0, 1 << 30)
        client.unregister_cuda_shared_memory()
        assert client.get_cuda_shared_memory_status() == []
    finally:
        client.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(inputs_handle)
        cudashm.destroy_shared_memory_region(outputs_handle)
