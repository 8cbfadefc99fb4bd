"""System shared memory end to end, through Triton's own client and its shared-memory helpers, against a
daemon serving the example repository (``simple``, ``simple_string``) and a slow copy of ``simple``."""

from __future__ import annotations

import functools
import shutil
import threading

import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.utils.shared_memory as shm
from tritonclient import utils
from tritonclient.utils import InferenceServerException

from appliance.backends.python.wire.arena import Arena
from appliance.examples import build_example_repository
from tests.descriptors import opened
from tests.http_util import call
from tests.shm_util import SIZE, X, Y, filled_region
from tests.waiting import wait_until

REMOTE = "127.0.0.2"


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = build_example_repository(tmp_path_factory.mktemp("shm") / "repo")
    # simple again, with a queue that holds a lone request for a second: a request that stays in flight.
    shutil.copytree(repo / "simple", repo / "slow_simple")
    config = (repo / "simple" / "config.pbtxt").read_text().replace('name: "simple"', 'name: "slow_simple"')
    (repo / "slow_simple" / "config.pbtxt").write_text(
        config + "dynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 1000000 }\n")
    return repo


@pytest.fixture
def triton_client(client):
    client.unregister_system_shared_memory()
    yield client
    client.unregister_system_shared_memory()


def _inputs(region: str, offset1: int = SIZE, byte_size: int = SIZE, model_input=("INPUT0", "INPUT1")):
    inputs = []
    for name, offset in zip(model_input, (0, offset1)):
        inputs.append(triton.InferInput(name, [1, 16], "INT32"))
        inputs[-1].set_shared_memory(region, byte_size, offset=offset)
    return inputs


def _outputs(region: str, byte_size: int = SIZE):
    outputs = []
    for name, offset in (("OUTPUT0", 0), ("OUTPUT1", byte_size)):
        outputs.append(triton.InferRequestedOutput(name, binary_data=True))
        outputs[-1].set_shared_memory(region, byte_size, offset=offset)
    return outputs


def _refused(call_, status_text: str | None = None) -> str:
    with pytest.raises(InferenceServerException) as caught:
        call_()
    if status_text is not None:
        assert caught.value.status() == status_text, caught.value
    return caught.value.message()


def test_metadata_lists_system_shared_memory_only(triton_client):
    extensions = triton_client.get_server_metadata()["extensions"]
    assert "system_shared_memory" in extensions and "cuda_shared_memory" not in extensions


def test_register_infer_status_unregister(triton_client, daemon, regions):
    in_key, in_handle = filled_region(regions)
    out_key, out_handle = regions(2 * SIZE)
    triton_client.register_system_shared_memory("input", in_key, 2 * SIZE)
    triton_client.register_system_shared_memory("output", out_key, 2 * SIZE)
    result = triton_client.infer("simple", _inputs("input"), outputs=_outputs("output"))
    for name, offset, expected in (("OUTPUT0", 0, X + Y), ("OUTPUT1", SIZE, X - Y)):
        output = result.get_output(name)
        assert "data" not in output and "parameters" not in output  # as Triton: written, nothing echoed
        got = shm.get_contents_as_numpy(out_handle, utils.triton_to_np_dtype(output["datatype"]), output["shape"],
                                        offset=offset)
        np.testing.assert_array_equal(got, expected)
    status = {r["name"]: r for r in triton_client.get_system_shared_memory_status()}
    assert status["input"] == {"name": "input", "key": in_key, "offset": 0, "byte_size": 2 * SIZE}
    assert triton_client.get_system_shared_memory_status("output")[0]["key"] == out_key
    assert opened(daemon.process.pid, in_key) == 1
    triton_client.unregister_system_shared_memory("input")
    assert [r["name"] for r in triton_client.get_system_shared_memory_status()] == ["output"]
    assert opened(daemon.process.pid, in_key) == 0  # unregistering gave the object back
    triton_client.unregister_system_shared_memory()
    assert triton_client.get_system_shared_memory_status() == []
    assert opened(daemon.process.pid, out_key) == 0


def test_bytes_tensors_in_shared_memory(triton_client, regions):
    words = np.array([[str(v).encode() for v in range(16)]], dtype=object)
    ones = np.array([[b"1"] * 16], dtype=object)
    packed0, packed1 = utils.serialize_byte_tensor(words), utils.serialize_byte_tensor(ones)
    size0, size1 = utils.serialized_byte_size(packed0), utils.serialized_byte_size(packed1)
    in_key, in_handle = regions(size0 + size1)
    out_key, out_handle = regions(256)
    shm.set_shared_memory_region(in_handle, [packed0])
    shm.set_shared_memory_region(in_handle, [packed1], offset=size0)
    triton_client.register_system_shared_memory("in", in_key, size0 + size1)
    triton_client.register_system_shared_memory("out", out_key, 256)
    inputs = [triton.InferInput("INPUT0", [1, 16], "BYTES"), triton.InferInput("INPUT1", [1, 16], "BYTES")]
    inputs[0].set_shared_memory("in", size0)
    inputs[1].set_shared_memory("in", size1, offset=size0)
    output = triton.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("out", 256)
    result = triton_client.infer("simple_string", inputs, outputs=[output, triton.InferRequestedOutput("OUTPUT1")])
    got = shm.get_contents_as_numpy(out_handle, np.object_, [1, 16])
    assert [int(v) for v in got.ravel()] == list(range(1, 17))
    assert [int(v) for v in result.as_numpy("OUTPUT1").ravel()] == list(range(-1, 15))  # in the response


def test_shared_memory_and_request_tensors_mix(triton_client, regions):
    key, handle = filled_region(regions, (X,))
    triton_client.register_system_shared_memory("x", key, SIZE)
    inputs = [triton.InferInput("INPUT0", [1, 16], "INT32"), triton.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("x", SIZE)
    inputs[1].set_data_from_numpy(Y, binary_data=False)
    out = triton.InferRequestedOutput("OUTPUT1")
    out.set_shared_memory("x", SIZE)  # written over the input it was computed from: inputs were copied first
    result = triton_client.infer("simple", inputs, outputs=[triton.InferRequestedOutput("OUTPUT0"), out])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), X + Y)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.int32, [1, 16]), X - Y)


def test_bad_registrations_are_refused_and_the_daemon_stays_up(triton_client, daemon, regions):
    key, _ = regions(SIZE)
    arena = Arena.create(1024)
    try:
        arena_key = "/" + arena.path.rsplit("/", 1)[1]
        cases = [
            (lambda: triton_client.register_system_shared_memory("r", key, SIZE + 1), "invalid args"),
            (lambda: triton_client.register_system_shared_memory("r", key, SIZE, offset=1), "invalid args"),
            (lambda: triton_client.register_system_shared_memory("r", key, 0), "'byte_size' must be"),
            (lambda: triton_client.register_system_shared_memory("r", "/../etc/passwd", 8), "plain shared memory"),
            (lambda: triton_client.register_system_shared_memory("r", arena_key, 8), "reserved prefix 'appliance-'"),
            (lambda: triton_client.register_system_shared_memory("r", key + "-gone", 8),
             f"Unable to open shared memory region: '{key}-gone'; no shared memory object"),
        ]
        for register, message in cases:
            text = _refused(register, "400")
            assert message in text  # Triton's words (which quote a bad key), then the fix
    finally:
        arena.close()
    triton_client.register_system_shared_memory("r", key, SIZE)
    assert "already in manager" in _refused(lambda: triton_client.register_system_shared_memory("r", key, 8), "400")
    assert triton_client.is_server_live() and triton_client.get_system_shared_memory_status()[0]["name"] == "r"


def test_bad_uses_are_refused_and_the_daemon_stays_up(triton_client, regions):
    key, handle = filled_region(regions)
    triton_client.register_system_shared_memory("io", key, 2 * SIZE)
    cases = [
        (_inputs("io", offset1=2 * SIZE), None, "400", "Invalid offset for shared memory region: 'io'"),
        (_inputs("io", offset1=SIZE + 4), None, "400", "Invalid offset + byte size for shared memory region: 'io'"),
        (_inputs("io", byte_size=60), None, "400", "input byte size mismatch for input 'INPUT0' for model 'simple'. "
                                                   "Expected 64, got 60"),
        (_inputs("nowhere"), None, "404", "Unable to find shared memory region: 'nowhere'"),
        (_inputs("io"), _outputs("io", byte_size=96), "400", "Invalid offset + byte size"),
        (_inputs("io"), _outputs("io", byte_size=32), "400",
         "shared memory size specified with the request for output 'OUTPUT0' (32 bytes) should be at least 64 "
         "bytes to hold the results"),
    ]
    for inputs, outputs, status, message in cases:
        text = _refused(functools.partial(triton_client.infer, "simple", inputs, outputs=outputs), status)
        assert message in text and key.strip("/") not in text
    assert triton_client.is_server_live()
    result = triton_client.infer("simple", _inputs("io"))  # the region still serves a good request
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), X + Y)


def test_an_object_shrunk_under_its_region_is_an_error_not_a_crash(triton_client, daemon, regions):
    key, handle = filled_region(regions)
    triton_client.register_system_shared_memory("io", key, 2 * SIZE)
    import os

    fd = os.open(f"/dev/shm{key}", os.O_RDWR)
    try:
        os.ftruncate(fd, 16)  # a mapping of the region would now SIGBUS on access
    finally:
        os.close(fd)
    assert "smaller than the region" in _refused(lambda: triton_client.infer("simple", _inputs("io")), "400")
    assert "smaller than the region" in _refused(
        lambda: triton_client.infer("simple", [triton.InferInput("INPUT0", [1, 16], "INT32").set_data_from_numpy(X),
                                               triton.InferInput("INPUT1", [1, 16], "INT32").set_data_from_numpy(Y)],
                                    outputs=_outputs("io")), "400")
    assert daemon.process.poll() is None and triton_client.is_server_live()


def _pending(port: int, model: str) -> float:
    """The model's nv_inference_pending_request_count on /metrics: requests queued, not yet executing."""
    text = call(port, "GET", "/metrics")[2]
    text = text.decode() if isinstance(text, bytes) else str(text)
    prefix = f'nv_inference_pending_request_count{{model="{model}",'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def test_a_region_unregistered_during_a_request(triton_client, daemon, regions):
    in_key, in_handle = filled_region(regions)
    out_key, out_handle = regions(2 * SIZE)
    triton_client.register_system_shared_memory("in", in_key, 2 * SIZE)
    triton_client.register_system_shared_memory("out", out_key, 2 * SIZE)
    results: list = []

    def infer() -> None:  # tritonclient's HTTP client stays in the thread that made it (gevent)
        with triton.InferenceServerClient(daemon.url) as own:
            try:
                results.append(own.infer("slow_simple", _inputs("in"), outputs=_outputs("out")))
            except InferenceServerException as exc:
                results.append(exc)

    worker = threading.Thread(target=infer)
    worker.start()
    wait_until(lambda: _pending(daemon.port, "slow_simple") == 1, timeout=10,
               what="the request in slow_simple's queue (where it waits for about a second)")
    triton_client.unregister_system_shared_memory()
    # As Triton: the regions the request holds stay listed (and open) until it ends.
    assert sorted(r["name"] for r in triton_client.get_system_shared_memory_status()) == ["in", "out"]
    assert opened(daemon.process.pid, out_key) == 1 and opened(daemon.process.pid, in_key) == 1
    worker.join(30)
    assert not isinstance(results[0], Exception), results
    # The request finished into the region it named; then the daemon unregistered both and let go of them.
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.int32, [1, 16]), X + Y)
    assert triton_client.get_system_shared_memory_status() == []
    assert opened(daemon.process.pid, out_key) == 0 and opened(daemon.process.pid, in_key) == 0
    assert triton_client.is_server_live()


def test_cuda_routes_say_what_they_need(triton_client):
    text = _refused(lambda: triton_client.register_cuda_shared_memory("gpu", b"AAAA", 0, 64), "501")
    assert "needs an NVIDIA GPU" in text and "nvidia flavour" in text
    assert triton_client.get_cuda_shared_memory_status() == []
    triton_client.unregister_cuda_shared_memory()  # as Triton without GPUs: nothing to unregister


def test_registration_takes_the_control_rules(daemon):
    key = "/shmtest-never-created"
    body = {"key": key, "byte_size": 8}
    status, _, payload = call(daemon.port, "POST", "/v2/systemsharedmemory/region/r/register", body,
                              headers={"Origin": "http://evil.example"})
    assert status == 403 and "other origins" in payload["error"]
    status, _, payload = call(daemon.port, "POST", "/v2/systemsharedmemory/region/r/register", "key=x",
                              headers={"Content-Type": "application/x-www-form-urlencoded",
                                       "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"})
    assert status == 415
    status, _, payload = call(daemon.port, "POST", "/v2/systemsharedmemory/region/r/register", "key=x",
                              headers={"Content-Type": "text/plain"})
    assert status == 415


@pytest.mark.parametrize("headers", [
    {"Content-Type": "text/plain", "Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
    {"Content-Type": "text/plain"},
    {"Origin": "http://evil.example"},
    {"Sec-Fetch-Site": "cross-site"},
])
def test_a_cross_site_page_cannot_write_into_another_clients_region(daemon, triton_client, regions, headers):
    """Issue 22 item 5: an inference request that names a region gets the control endpoints' browser
    rules (a page could make a browser on the box write model outputs into a victim's region)."""
    key, handle = filled_region(regions)
    triton_client.register_system_shared_memory("victim_out", key, 2 * SIZE)
    body = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": [1] * 16} for n in ("INPUT0",
                                                                                                    "INPUT1")],
            "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "victim_out",
                                                           "shared_memory_byte_size": SIZE}}]}
    status, _, payload = call(daemon.port, "POST", "/v2/models/simple/infer", body, headers=headers)
    assert status in (403, 415) and "shared memory" in payload["error"], payload
    assert shm.get_contents_as_numpy(handle, np.int32, [1, 16]).tolist() == X.tolist()  # untouched
    plain = {"inputs": body["inputs"]}  # no region named: inference stays open to pages, as Triton's
    assert call(daemon.port, "POST", "/v2/models/simple/infer", plain, headers=headers)[0] == 200
    assert call(daemon.port, "POST", "/v2/models/simple/infer", body)[0] == 200  # a program, not a page


@pytest.fixture(scope="module")
def narrow_daemon(module_daemon, repository):
    """A daemon for which only 127.0.0.1 is this host (no shm_local_networks: the client must connect from
    the address it connects to), and only 127.0.0.1 is exempt from the token."""
    return module_daemon(repository, env={"APPLIANCE_SHM_LOCAL_NETWORKS": "",
                                          "APPLIANCE_AUTH_EXEMPT_NETWORKS": "127.0.0.1/32"})


def test_a_client_on_another_address_may_not_use_shared_memory(narrow_daemon, regions):
    daemon = narrow_daemon
    token = (daemon.log_path.parent / "auth-token").read_text().strip()
    auth = {"Authorization": f"Bearer {token}"}
    key, handle = filled_region(regions)
    register = "/v2/systemsharedmemory/region/io/register"
    body = {"key": key, "offset": 0, "byte_size": 2 * SIZE}
    assert call(daemon.port, "POST", register, body, source=REMOTE)[0] == 401  # a control endpoint: the token
    status, _, payload = call(daemon.port, "POST", register, body, headers=auth, source=REMOTE)
    assert status == 403 and "client_shm = local" in payload["error"] and key.strip("/") not in payload["error"]
    assert call(daemon.port, "GET", "/v2/systemsharedmemory/status", source=REMOTE)[0] == 403
    # From 127.0.0.1 to 127.0.0.1: this host.
    assert call(daemon.port, "POST", register, body)[0] == 200
    infer = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32",
                         "parameters": {"shared_memory_region": "io", "shared_memory_byte_size": SIZE,
                                        "shared_memory_offset": o}} for n, o in (("INPUT0", 0), ("INPUT1", SIZE))]}
    status, _, payload = call(daemon.port, "POST", "/v2/models/simple/infer", infer, source=REMOTE)
    assert status == 403 and "client_shm = local" in payload["error"]  # another address cannot read the region
    status, _, payload = call(daemon.port, "POST", "/v2/models/simple/infer", infer)
    assert status == 200 and payload["outputs"][0]["data"] == list((X + Y).ravel())
    assert call(daemon.port, "POST", "/v2/systemsharedmemory/unregister", {}, headers=auth, source=REMOTE)[0] == 403
    assert call(daemon.port, "POST", "/v2/systemsharedmemory/unregister", {})[0] == 200
