"""The system shared-memory registry: registration checks, status, unregistering, limits, stop."""

from __future__ import annotations

import os
import uuid

import pytest

from appliance.backends.python.wire.arena import Arena
from appliance.core.errors import AlreadyExists, ApplianceError, Forbidden, InvalidInput, RegionNotFound
from appliance.protocol.shared_memory import LocalPeers, SharedMemoryLimits, SharedMemoryRegistry
from appliance.protocol.shared_memory.system import shown
from tests.descriptors import opened


def registry(client_shm: str = "local", **limits) -> SharedMemoryRegistry:
    return SharedMemoryRegistry(client_shm, SharedMemoryLimits(**limits), LocalPeers(["127.0.0.0/8"]))


_OWN: dict[str, int] = {}


@pytest.fixture
def shm_object(shm_object):
    """The shared factory, noting the descriptors the test's own SharedMemory object holds."""

    def make(size: int):
        key, memory = shm_object(size)
        _OWN[key] = opened("self", key)
        return key, memory

    return make


def held(key: str) -> int:
    """Descriptors this process holds on the object beyond the test's own."""
    return opened("self", key) - _OWN[key]


def refused(call, key: str | None = None) -> ApplianceError:
    """The error ``call`` raises; where it quotes the key (Triton's words do), it quotes it escaped and cut."""
    with pytest.raises(ApplianceError) as caught:
        call()
    if key and key.lstrip("/")[:10] in caught.value.message:
        assert shown(key).lstrip("/") in caught.value.message
    assert caught.value.message.isprintable()
    return caught.value


def test_register_status_unregister(shm_object):
    shm = registry()
    key_a, _ = shm_object(256)
    key_b, _ = shm_object(64)
    shm.system.register("a", key_a, 0, 256, local=True)
    shm.system.register("b", key_b, 16, 48, local=True)
    assert shm.system.status(local=True) == [
        {"name": "a", "key": key_a, "offset": 0, "byte_size": 256},
        {"name": "b", "key": key_b, "offset": 16, "byte_size": 48},
    ]
    assert shm.system.status("b", local=True) == [{"name": "b", "key": key_b, "offset": 16, "byte_size": 48}]
    assert held(key_a) and held(key_b)
    shm.system.unregister("a", local=True)
    assert not held(key_a) and held(key_b)
    assert [r["name"] for r in shm.system.status(local=True)] == ["b"]
    shm.system.unregister("never-registered", local=True)  # as Triton: not an error
    shm.system.unregister(local=True)
    assert shm.system.status(local=True) == [] and not held(key_b)
    assert shm.counts() == (0, 0)
    with pytest.raises(RegionNotFound, match="Unable to find system shared memory region: 'b'"):
        shm.system.status("b", local=True)


def test_a_key_without_its_leading_slash_names_the_same_object(shm_object):
    shm = registry()
    key, memory = shm_object(32)
    memory.buf[:4] = b"abcd"
    shm.system.register("r", key.lstrip("/"), 0, 32, local=True)
    assert held(key)
    shm.close()


@pytest.mark.parametrize(("offset", "byte_size"), [(0, 65), (64, 1), (1, 64), (1 << 62, 8)])
def test_registration_beyond_the_object_is_refused(shm_object, offset, byte_size):
    shm = registry()
    key, _ = shm_object(64)
    error = refused(lambda: shm.system.register("r", key, offset, byte_size, local=True), key)
    assert isinstance(error, InvalidInput) and "invalid args" in error.message and "'r'" in error.message
    assert not held(key) and shm.counts() == (0, 0)


@pytest.mark.parametrize(("offset", "byte_size"), [(-1, 8), (0, 0), (0, -8), (True, 8), (0, 8.0), ("0", 8), (0, None)])
def test_offsets_and_sizes_must_be_integers_in_range(shm_object, offset, byte_size):
    shm = registry()
    key, _ = shm_object(64)
    assert isinstance(refused(lambda: shm.system.register("r", key, offset, byte_size, local=True), key), InvalidInput)


@pytest.mark.parametrize("key", ["/a/b", "a/b", "../shmtest", "/..", "/.hidden", "", "/", "//x", "x\x00y",
                                 "x" * 256, "/dev/shm/x", "na\u00efve", None, 7])
def test_keys_that_are_not_plain_object_names_are_refused(key):
    error = refused(lambda: registry().system.register("r", key, 0, 8, local=True),
                    key if isinstance(key, str) and len(key) > 2 else None)
    assert isinstance(error, InvalidInput) and "plain shared memory object name" in error.message


def test_the_appliance_arenas_are_refused():
    arena = Arena.create(1024)  # the Python backend's tensor arena, in /dev/shm
    try:
        name = os.path.basename(arena.path)
        for key in (name, "/" + name):
            error = refused(lambda key=key: registry().system.register("r", key, 0, 8, local=True), name)
            assert "reserved prefix" in error.message
    finally:
        arena.close()
    error = refused(lambda: registry().system.register("r", "/sem.lock", 0, 8, local=True))
    assert "reserved prefix 'sem.'" in error.message


def test_missing_objects_links_and_non_files_are_refused(tmp_path):
    shm = registry()
    name = f"shmtest-{uuid.uuid4().hex[:12]}"
    message = refused(lambda: shm.system.register("r", "/" + name, 0, 8, local=True), name).message
    assert message.startswith(f"Unable to open shared memory region: '/{name}'; no shared memory object")
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 64)
    os.symlink(secret, f"/dev/shm/{name}")  # a link to a file of the appliance's must never be read
    try:
        assert "symbolic link" in refused(lambda: shm.system.register("r", "/" + name, 0, 8, local=True),
                                          name).message
    finally:
        os.unlink(f"/dev/shm/{name}")
    os.mkfifo(f"/dev/shm/{name}")
    try:
        message = refused(lambda: shm.system.register("r", "/" + name, 0, 8, local=True), name).message
        assert message.startswith(f"Invalid shared memory region: '/{name}'; the key does not name a shared memory")
    finally:
        os.unlink(f"/dev/shm/{name}")
    assert shm.counts() == (0, 0)


def test_a_taken_name_is_refused(shm_object):
    shm = registry()
    key, _ = shm_object(64)
    shm.system.register("r", key, 0, 64, local=True)
    with pytest.raises(AlreadyExists, match="'r' already in manager"):
        shm.system.register("r", key, 0, 32, local=True)
    shm.close()


def test_limits_on_regions_and_bytes(shm_object):
    shm = registry(max_regions=2, max_bytes=100)
    keys = [shm_object(64)[0] for _ in range(3)]
    shm.system.register("a", keys[0], 0, 40, local=True)
    assert "shm_max_bytes" in refused(lambda: shm.system.register("b", keys[1], 0, 61, local=True)).message
    shm.system.register("b", keys[1], 0, 60, local=True)
    assert "shm_max_regions" in refused(lambda: shm.system.register("c", keys[2], 0, 1, local=True)).message
    shm.system.unregister("a", local=True)
    shm.system.register("c", keys[2], 0, 40, local=True)
    assert shm.counts() == (2, 100)
    shm.close()


def test_close_unregisters_everything_and_refuses_new_regions(shm_object):
    shm = registry()
    keys = [shm_object(64)[0] for _ in range(3)]
    for index, key in enumerate(keys):
        shm.system.register(f"r{index}", key, 0, 64, local=True)
    shm.close()
    assert not any(held(key) for key in keys)
    assert shm.system.status(local=True) == [] and shm.counts() == (0, 0)
    assert "stopping" in refused(lambda: shm.system.register("again", keys[0], 0, 8, local=True)).message


@pytest.mark.parametrize("client_shm", ["off", "local"])
def test_clients_the_setting_does_not_admit_are_refused(shm_object, client_shm):
    shm = registry(client_shm)
    key, _ = shm_object(64)
    calls = [lambda: shm.system.register("r", key, 0, 64, local=False), lambda: shm.system.unregister(local=False)]
    if client_shm == "local":
        calls.append(lambda: shm.system.status(local=False))
    for call in calls:
        error = refused(call, key)
        assert isinstance(error, Forbidden) and f"client_shm = {client_shm}" in error.message
    assert not held(key)
    if client_shm == "local":
        shm.system.register("r", key, 0, 64, local=True)
        shm.close()
    assert shm.extensions() == ([] if client_shm == "off" else ["system_shared_memory"])


def test_any_admits_remote_clients(shm_object):
    shm = registry("any")
    key, _ = shm_object(64)
    shm.system.register("r", key, 0, 64, local=False)
    assert shm.system.status(local=False)[0]["name"] == "r"
    shm.system.unregister(local=False)
    assert not held(key)


def test_with_client_shared_memory_off_status_answers_and_the_rest_says_it_is_disabled(shm_object):
    # Triton >= 2.6x without --allow-client-shm (L0_shared_memory test_client_shm_disabled_by_default):
    # status allowed and empty; register and unregister refused with "Client shared memory is disabled".
    shm = registry("off")
    key, _ = shm_object(8)
    assert shm.system.status(local=True) == [] and shm.cuda.status(local=False) == []
    for call in (lambda: shm.system.register("r", key, 0, 8, local=True),
                 lambda: shm.system.unregister("r", local=True)):
        assert refused(call, key).message.startswith("Client shared memory is disabled")
    assert shm.system.status(local=True) == []


@pytest.mark.parametrize(("key", "words"), [
    ("/", "cannot register shared memory region 'r' - invalid shm key '/'"),
    ("///", "cannot register shared memory region 'r' - invalid shm key '///'"),
    ("/triton_python_backend_shm_region_1", "cannot register shared memory region 'r' with key "
     "'/triton_python_backend_shm_region_1' as the key contains the reserved prefix "
     "'triton_python_backend_shm_region_'"),
    ("/bad\nkey" + "x" * 200, "cannot register shared memory region 'r' - invalid shm key '/bad\\nkey" + "x" * 71
     + "...'"),
])
def test_bad_keys_get_tritons_words(key, words):
    # qa L0_shared_memory's test_register_invalid_shm_key and test_register_reserved_names match these.
    assert refused(lambda: registry().system.register("r", key, 0, 8, local=True), key).message.startswith(words)


def test_a_missing_object_is_said_before_a_bad_size():
    # qa L0_grpc python_grpc_aio_test registers '/test_shm', which does not exist, with byte_size 0.
    missing = f"/shmtest-{uuid.uuid4().hex[:12]}"
    error = refused(lambda: registry().system.register("test_shm", missing, 0, 0, local=True), missing)
    assert error.message.startswith(f"Unable to open shared memory region: '{missing}'")
