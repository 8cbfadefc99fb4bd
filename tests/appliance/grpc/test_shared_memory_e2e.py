"""System shared memory over gRPC, through tritonclient.grpc and its shared-memory helpers, on the same core
as REST: register, infer with inputs and outputs in regions (mixed with request tensors, and in a stream),
status, unregister; bounds and names checked on every use with Triton's status codes; keys never echoed;
client_shm = local keeps other addresses out; CUDA regions say what they need."""

from __future__ import annotations

import base64
import functools
import queue
import re
import uuid

import numpy as np
import pytest
import tritonclient.grpc as triton
import tritonclient.utils.shared_memory as shm
from tritonclient import utils
from tritonclient.utils import InferenceServerException

from appliance.examples import build_example_repository
from tests.descriptors import opened
from tests.relay import relay
from tests.shm_util import SIZE, X, Y, filled_region

REMOTE = "127.0.0.2"


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return build_example_repository(tmp_path_factory.mktemp("grpc-shm") / "repo")


@pytest.fixture
def client(daemon):
    with triton.InferenceServerClient(daemon.grpc_url) as client:
        client.unregister_system_shared_memory()
        yield client
        client.unregister_system_shared_memory()


def _inputs(region: str, byte_size: int = SIZE, offset1: int = SIZE) -> list[triton.InferInput]:
    inputs = []
    for name, offset in (("INPUT0", 0), ("INPUT1", offset1)):
        inputs.append(triton.InferInput(name, [1, 16], "INT32"))
        inputs[-1].set_shared_memory(region, byte_size, offset=offset)
    return inputs


def _outputs(region: str, byte_size: int = SIZE) -> list[triton.InferRequestedOutput]:
    outputs = []
    for name, offset in (("OUTPUT0", 0), ("OUTPUT1", byte_size)):
        outputs.append(triton.InferRequestedOutput(name))
        outputs[-1].set_shared_memory(region, byte_size, offset=offset)
    return outputs


def _refused(call, status: str) -> str:
    with pytest.raises(InferenceServerException) as caught:
        call()
    assert caught.value.status() == f"StatusCode.{status}", caught.value
    return caught.value.message()


def test_register_infer_status_unregister(client, daemon, regions):
    in_key, in_handle = filled_region(regions)
    out_key, out_handle = regions(2 * SIZE)
    assert "system_shared_memory" in client.get_server_metadata().extensions
    client.register_system_shared_memory("input", in_key, 2 * SIZE)
    client.register_system_shared_memory("output", out_key, 2 * SIZE)
    result = client.infer("simple", _inputs("input"), outputs=_outputs("output"))
    for name, offset, expected in (("OUTPUT0", 0, X + Y), ("OUTPUT1", SIZE, X - Y)):
        output = result.get_output(name)
        assert not output.parameters  # as Triton: written into the region, nothing echoed
        got = shm.get_contents_as_numpy(out_handle, utils.triton_to_np_dtype(output.datatype), output.shape,
                                        offset=offset)
        np.testing.assert_array_equal(got, expected)
    status = client.get_system_shared_memory_status().regions
    assert set(status) == {"input", "output"}
    assert (status["input"].key, status["input"].offset, status["input"].byte_size) == (in_key, 0, 2 * SIZE)
    assert list(client.get_system_shared_memory_status("output").regions) == ["output"]
    assert opened(daemon.process.pid, in_key) == 1
    client.unregister_system_shared_memory("input")
    assert list(client.get_system_shared_memory_status().regions) == ["output"]
    assert opened(daemon.process.pid, in_key) == 0  # unregistering gave the object back
    client.unregister_system_shared_memory()
    assert not client.get_system_shared_memory_status().regions


def test_mixed_with_request_tensors_and_in_a_stream(client, regions):
    in_key, _ = filled_region(regions, (X,))
    client.register_system_shared_memory("x", in_key, SIZE)
    inputs = [triton.InferInput("INPUT0", [1, 16], "INT32"), triton.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("x", SIZE)
    inputs[1].set_data_from_numpy(Y)  # the only raw_input_contents entry
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), X + Y)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("simple", inputs, request_id="streamed")
        client.async_stream_infer("simple", inputs, request_id="missing-region",
                                  outputs=[_outputs("nowhere")[0]])
        got = dict(answers.get(timeout=20) for _ in range(2))
    finally:
        client.stop_stream()
    (result,) = [r for r in got if r is not None]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), X - Y)
    (error,) = [e for e in got.values() if e is not None]
    assert "Unable to find shared memory region: 'nowhere'" in error.message()


def test_bad_registrations_and_uses(client, daemon, regions):
    key, handle = filled_region(regions)
    client.register_system_shared_memory("r", key, 2 * SIZE)
    message = _refused(lambda: client.register_system_shared_memory("r", key, SIZE), "ALREADY_EXISTS")
    assert "already in manager" in message and key not in message
    _refused(lambda: client.infer("simple", _inputs("nowhere")), "NOT_FOUND")
    message = _refused(lambda: client.infer("simple", _inputs("r", offset1=2 * SIZE - 8)), "INVALID_ARGUMENT")
    assert "Invalid offset + byte size for shared memory region: 'r'" in message
    _refused(lambda: client.infer("simple", _inputs("r", byte_size=SIZE - 4)), "INVALID_ARGUMENT")
    message = _refused(lambda: client.infer("simple", _inputs("r"), outputs=_outputs("r", byte_size=32)),
                       "INVALID_ARGUMENT")
    assert "should be at least 64 bytes" in message
    message = _refused(lambda: client.register_system_shared_memory("big", key, 4 * SIZE), "INVALID_ARGUMENT")
    assert key not in message
    missing = "/missing-" + uuid.uuid4().hex
    for bad_key, words in (("/../etc/passwd", "cannot register shared memory region 'bad' - invalid shm key "
                                              "'/../etc/passwd'"),
                           ("/appliance-arena-1", "as the key contains the reserved prefix 'appliance-'"),
                           (missing, f"Unable to open shared memory region: '{missing}'")):
        message = _refused(functools.partial(client.register_system_shared_memory, "bad", bad_key, SIZE),
                           "INVALID_ARGUMENT")
        assert words in message  # Triton's words (its status is INTERNAL: see differences-from-triton.md)
    assert client.is_server_live()


def test_other_hosts_are_kept_out(start_daemon, repository, tmp_path, regions):
    """client_shm = local: a client on another address (with the token) is refused, loopback is served."""
    state = tmp_path / "state"
    daemon = start_daemon(repository, state=state, env={"APPLIANCE_AUTH_EXEMPT_NETWORKS": "127.0.0.1/32",
                                                        "APPLIANCE_SHM_LOCAL_NETWORKS": "127.0.0.1/32"})
    token = {"authorization": f"Bearer {(state / 'auth-token').read_text().strip()}"}
    key, handle = filled_region(regions)
    with relay(daemon.grpc_port, REMOTE) as port, triton.InferenceServerClient(f"127.0.0.1:{port}") as remote:
        _refused(lambda: remote.register_system_shared_memory("r", key, 2 * SIZE), "UNAUTHENTICATED")
        message = _refused(lambda: remote.register_system_shared_memory("r", key, 2 * SIZE, headers=token),
                           "PERMISSION_DENIED")
        assert "client_shm = local" in message
        with triton.InferenceServerClient(daemon.grpc_url) as local:
            local.register_system_shared_memory("r", key, 2 * SIZE)
            _refused(lambda: remote.infer("simple", _inputs("r")), "PERMISSION_DENIED")
            _refused(lambda: remote.get_system_shared_memory_status(), "PERMISSION_DENIED")
            np.testing.assert_array_equal(local.infer("simple", _inputs("r")).as_numpy("OUTPUT0"), X + Y)


def test_cuda_shared_memory_says_what_it_needs(client):
    if "cuda_shared_memory" in client.get_server_metadata().extensions:
        pytest.skip("this box serves CUDA shared memory (its own tests cover it)")
    assert not client.get_cuda_shared_memory_status().regions  # nothing registered, as Triton without GPUs
    message = _refused(lambda: client.register_cuda_shared_memory("g", base64.b64encode(b"\0" * 64), 0, 64),
                       "UNIMPLEMENTED")
    assert "CUDA" in message
    client.unregister_cuda_shared_memory()


def test_a_register_without_a_name_is_refused_in_tritons_words(client):
    # qa L0_grpc python_grpc_aio_test's test_register_cuda_shared_memory: "failed to register shared memory
    # region.*invalid args", whether or not the box serves CUDA shared memory; the same for system regions.
    message = _refused(lambda: client.register_cuda_shared_memory("", b"", 0, 0), "INVALID_ARGUMENT")
    assert re.search("failed to register shared memory region.*invalid args", message)
    message = _refused(lambda: client.register_system_shared_memory("", "/key", 64), "INVALID_ARGUMENT")
    assert re.search("failed to register shared memory region.*invalid args", message)
