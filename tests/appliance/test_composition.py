"""The composition root: what it starts, what it tolerates, how it stops."""

from __future__ import annotations

import asyncio
import threading

import pytest

from appliance.composition import compose
from appliance.core.errors import ConfigError, ModelNotFound
from appliance.examples import build_example_repository
from appliance.settings import Settings
from tests.appliance.protocol.sources import LOCAL, Decoded
from tests.readonly import unwritable
from tests.waiting import await_until


def _settings(tmp_path, **overrides) -> Settings:
    values = {"state_dir": tmp_path / "state", "model_repository": build_example_repository(tmp_path / "repo"),
              "selection": False, **overrides}
    return Settings.build(**values)


async def test_starts_loads_and_stops_in_reverse(tmp_path):
    appliance = await compose(_settings(tmp_path))
    await asyncio.wait_for(appliance.dataplane.wait_loaded(), 60)
    assert appliance.dataplane.live() and appliance.registry.ready_count() == 3
    assert appliance.metrics is not None and (tmp_path / "state" / "metrics.db").exists()
    assert await appliance.close() == []
    assert appliance.registry.ready_count() == 0
    with pytest.raises(ModelNotFound, match="has no available versions; server is shutting down"):
        appliance.dataplane.model_metadata("simple")


async def test_the_daemon_starts_without_a_writable_place_for_its_token(tmp_path):
    appliance = await compose(_settings(tmp_path, state_dir=unwritable(tmp_path), metrics=False))
    try:
        assert "token_not_saved" in [p.kind for p in appliance.state.problems] and len(appliance.token) >= 32
    finally:
        await appliance.close()


async def test_an_empty_token_file_stops_the_start_with_the_fix(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "auth-token").write_text("")
    with pytest.raises(ConfigError, match="delete the file"):
        await compose(_settings(tmp_path))


async def test_a_repository_load_that_dies_makes_the_server_not_live(tmp_path, monkeypatch):
    import hardware_probe

    def broken_probe(path, timeout: float = 60.0):
        raise RuntimeError("the probe child could not start")

    monkeypatch.setattr(hardware_probe, "probe_cached", broken_probe)
    appliance = await compose(_settings(tmp_path, metrics=False))
    try:
        await await_until(lambda: not appliance.dataplane.live(), timeout=30, what="the server to stop being live")
        assert "the probe child could not start" in (appliance.dataplane.failure or "")
    finally:
        await appliance.close()


async def test_a_failing_start_stops_what_it_had_started(tmp_path):
    settings = _settings(tmp_path)
    (tmp_path / "missing").mkdir()
    bad = Settings.build(state_dir=settings.server.state_dir, model_repository=tmp_path / "missing" / "repo",
                         selection=False)
    with pytest.raises(ConfigError, match="does not exist"):
        await compose(bad)
    # The metrics history it had opened is closed again: a new start opens the same database.
    appliance = await compose(settings)
    await appliance.close()


async def test_shared_memory_regions_are_closed_at_stop(tmp_path, shm_object):
    from tests.descriptors import opened

    appliance = await compose(_settings(tmp_path, metrics=False, shm_max_regions=3))
    key, _ = shm_object(64)
    own = opened("self", key)
    try:
        appliance.shared_memory.system.register("r", key, 0, 64, local=True)
        assert appliance.shared_memory.counts() == (1, 64) and opened("self", key) == own + 1
        assert "system_shared_memory" in appliance.dataplane.server_metadata().extensions
    finally:
        await appliance.close()
    assert opened("self", key) == own and appliance.shared_memory.counts() == (0, 0)
    with pytest.raises(Exception, match="stopping"):
        appliance.shared_memory.system.register("again", key, 0, 64, local=True)


async def test_a_read_only_state_dir_keeps_traces_in_memory_and_says_so(tmp_path):
    import numpy as np
    from tritonclient.utils import triton_to_np_dtype

    from appliance.engine.types import InferInput, InferRequest

    appliance = await compose(_settings(tmp_path, state_dir=unwritable(tmp_path), metrics=False))
    try:
        (read_only,) = [p for p in appliance.state.problems if p.kind == "read_only"]
        assert "traces stay in memory" in read_only.message
        await asyncio.wait_for(appliance.dataplane.wait_loaded(), 60)
        appliance.traces.update({"trace_level": ["TIMESTAMPS"], "trace_rate": ["1"]})
        dataplane = appliance.dataplane
        metadata = dataplane.model_metadata("simple")
        inputs = [InferInput(t.name, t.datatype, np.zeros([1 if d == -1 else d for d in t.shape],
                                                         dtype=triton_to_np_dtype(t.datatype)))
                  for t in metadata.inputs]
        async with dataplane.infer(LOCAL, Decoded("simple", InferRequest(inputs))):
            pass
        tracer = appliance.tracer
        await asyncio.to_thread(tracer.writer.flush)
        (trace,) = tracer.writer.kept()
        assert trace["model_name"] == "simple" and len(trace["timestamps"]) == 7
    finally:
        await appliance.close()


async def test_each_front_end_gets_its_configuration_from_its_sections(tmp_path):
    appliance = await compose(_settings(tmp_path, metrics=False, max_request_bytes=16 << 20,
                                        max_request_memory_bytes=64 << 20, max_connections=400,
                                        grpc_stream_max_pending=3, body_timeout=7.0), connections=200)
    try:
        assert appliance.rest.body.max_bytes == 16 << 20 and appliance.rest.body.read_timeout == 7.0
        assert appliance.rest.history is None  # metrics off: no history to read
        grpc = appliance.grpc
        assert grpc is not None and grpc.receivers == 4 and grpc.max_message_bytes == 16 << 20
        assert grpc.stream.max_pending == 3 and grpc.receive_timeout == 7.0
        # max_connections fitted to 200 descriptors: a quarter for gRPC, the rest for HTTP and metrics.
        assert (appliance.http_connections, grpc.max_connections) == (150, 50)
    finally:
        await appliance.close()
    appliance = await compose(_settings(tmp_path, metrics=False, grpc=False))
    try:
        assert appliance.grpc is None and appliance.http_connections == 4096
    finally:
        await appliance.close()


async def test_loads_wait_for_the_selector_that_comes_with_the_hardware_probe(tmp_path, monkeypatch):
    import hardware_probe

    release = threading.Event()
    real = hardware_probe.probe_cached

    def slow_probe(path, timeout: float = 60.0):
        release.wait()
        return real(path, timeout)

    monkeypatch.setattr(hardware_probe, "probe_cached", slow_probe)
    appliance = await compose(_settings(tmp_path, metrics=False))
    try:
        await asyncio.sleep(0.3)
        assert not appliance.hardware.done() and appliance.registry.ready_count() == 0
        release.set()
        await asyncio.wait_for(appliance.dataplane.wait_loaded(), 60)
        assert appliance.hardware.done() and appliance.registry.ready_count() == 3
        assert "summary" in appliance.dataplane.hardware()
    finally:
        release.set()  # a probe still held would keep its thread, and the test's end, waiting for ever
        await appliance.close()


async def test_the_stream_settings_bound_every_decoupled_request(tmp_path):
    appliance = await compose(_settings(tmp_path, metrics=False, stream_buffer_bytes=1 << 20,
                                                stream_stall_timeout=5.0))
    try:
        limits = appliance.dataplane.rules.streams
        assert (limits.max_bytes, limits.stall_timeout) == (1 << 20, 5.0)
    finally:
        await appliance.close()


async def test_a_second_daemon_on_the_same_state_dir_stops_naming_the_first(tmp_path):
    settings = _settings(tmp_path, metrics=False, grpc=False)
    first = await compose(settings)
    try:
        with pytest.raises(ConfigError, match=r"another appliance daemon \(PID \d+\)"):
            await compose(settings)
    finally:
        await first.close()
    second = await compose(settings)  # the first one's stop released the directory
    await second.close()


async def test_a_restart_reuses_the_kept_probe_report(tmp_path, monkeypatch):
    """The second start of a daemon on the same box skips the probe (seconds of runtime imports)."""
    import hardware_probe.cached

    probes = []
    real = hardware_probe.cached.probe_isolated
    monkeypatch.setattr(hardware_probe.cached, "probe_isolated",
                        lambda timeout: probes.append(timeout) or real(timeout))
    for _ in range(2):
        appliance = await compose(_settings(tmp_path, metrics=False, grpc=False))
        try:
            await asyncio.wait_for(appliance.dataplane.wait_loaded(), 60)
            assert "summary" in appliance.dataplane.hardware()
        finally:
            await appliance.close()
    assert len(probes) == 1 and (tmp_path / "state" / "hardware-probe.json").is_file()
    appliance = await compose(_settings(tmp_path, metrics=False, grpc=False, probe_cache=False))
    try:
        await asyncio.wait_for(appliance.dataplane.wait_loaded(), 60)
    finally:
        await appliance.close()
    assert len(probes) == 2  # probe_cache = false probes at every start
