"""Model residency below every transport: a request loads its model on demand (one load however many
wait), idle models are unloaded (never a pinned one, one in use, or a step of a loaded ensemble), a memory
budget unloads the least recently used idle models to make room and refuses a model larger than itself
(507), memory pressure unloads idle models, and each load and unload is counted with its cause."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from appliance.backends import RuntimeOptions
from appliance.core.errors import InsufficientStorage, ModelNotFound, Unavailable
from appliance.engine.types import InferInput, InferRequest
from appliance.grpc.service import InferMessage
from appliance.protocol.dataplane import DataPlane
from appliance.repository.memory import MIB, Pressure
from appliance.repository.registry import ModelRegistry
from appliance.repository.residency import ResidencyRules
from tests.appliance.protocol.sources import LOCAL, Decoded
from tests.builders import affine_model, write_model
from tests.waiting import await_until

WIDTH = 8


def _config(memory_mib: int | None = None, **parameters: str) -> str:
    given = dict(parameters)
    if memory_mib is not None:
        given["memory_mib"] = str(memory_mib)
    return "".join(f'parameters: {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in given.items())


@pytest.fixture
def repo(tmp_path):
    """Models a, b, c (each saying it needs 40 MiB), big (200 MiB) and lazy (its own idle_unload_secs)."""
    root = tmp_path / "repo"
    for scale, name in enumerate("abc", start=1):
        write_model(root, name, affine_model(scale, 0, WIDTH), config=_config(40))
    write_model(root, "big", affine_model(1, 0, WIDTH), config=_config(200))
    write_model(root, "lazy", affine_model(1, 0, WIDTH), config=_config(40, idle_unload_secs="0.05"))
    write_model(root, "held", affine_model(1, 0, WIDTH), config=_config(40, pinned="true"))
    write_model(root, "plain", affine_model(1, 0, WIDTH))  # says nothing: estimated from its files
    return root


@pytest.fixture
async def make_plane(tmp_path):
    """make_plane(rules, pressure=None) -> (DataPlane, ModelRegistry, events), nothing loaded yet."""
    made: list[ModelRegistry] = []

    async def make(rules: ResidencyRules, load: tuple[str, ...] = ()):
        events: list[tuple] = []
        registry = ModelRegistry(tmp_path / "repo", RuntimeOptions(), drain_timeout=2, residency=rules,
                                 on_event=lambda *event: events.append(event))
        made.append(registry)
        await registry.load_all(load)
        registry.residency.mark_not_loaded()
        plane = DataPlane(registry)
        plane.mark_loaded()
        return plane, registry, events

    yield make
    for registry in made:
        await registry.close(5)


async def _infer(plane: DataPlane, model: str, scale: float = 1.0) -> None:
    x = np.ones((1, WIDTH), dtype=np.float32)
    async with plane.infer(LOCAL, Decoded(model, InferRequest([InferInput("x", "FP32", x)]))) as result:
        np.testing.assert_allclose(result.response.outputs[0].data, x * scale)


def _loaded(registry: ModelRegistry) -> set[str]:
    return {e.name for e in registry.entries() if e.versions}


async def _unload_idle_until_gone(registry: ModelRegistry, *names: str) -> None:
    """Look for idle models, as the daemon's timer does, until ``names`` (every model, when none) are unloaded."""
    async def gone() -> bool:
        await registry.residency.unload_idle()
        loaded = _loaded(registry)
        return not (loaded & set(names) if names else loaded)

    await await_until(gone, timeout=10, what=f"{', '.join(names) or 'every model'} unloaded for idleness",
                      interval=0.02)


def _residency(events: list[tuple], action: str) -> list[tuple[str, str]]:
    return [(model, detail["cause"]) for kind, model, _, detail in events
            if kind == "model_residency" and detail["action"] == action]


async def test_a_request_loads_its_model_on_demand_and_the_index_says_why(repo, make_plane):
    plane, registry, events = await make_plane(ResidencyRules(load_on_demand=True))
    assert _loaded(registry) == set()
    row = next(r for r in plane.repository_index() if r.name == "b")
    assert row.state == "UNAVAILABLE" and "first request" in row.reason
    await _infer(plane, "b", scale=2.0)
    assert _loaded(registry) == {"b"}
    row = next(r for r in plane.repository_index() if r.name == "b")
    assert row.state == "READY" and "load_on_demand" in row.reason
    assert _residency(events, "load") == [("b", "demand")]
    assert registry.residency.first_request_seconds["b"] > 0
    assert plane.ready()  # models not loaded yet do not make the server unready


async def test_without_load_on_demand_a_model_not_loaded_is_not_found(repo, make_plane):
    plane, registry, _ = await make_plane(ResidencyRules())
    with pytest.raises(ModelNotFound):
        await _infer(plane, "a")
    assert _loaded(registry) == set()


async def test_concurrent_first_requests_wait_for_one_load(repo, make_plane):
    plane, registry, events = await make_plane(ResidencyRules(load_on_demand=True))
    await asyncio.gather(*(_infer(plane, "c", scale=3.0) for _ in range(50)))
    assert registry.residency.loads[("c", "demand")] == 1
    assert [e for e in events if e[0] == "model_loaded"] == [("model_loaded", "c", 1, {
        "platform": "onnxruntime_onnx", "backend": "onnxruntime"})]


async def test_an_unknown_model_is_still_not_found_with_load_on_demand(repo, make_plane):
    plane, registry, _ = await make_plane(ResidencyRules(load_on_demand=True))
    with pytest.raises(ModelNotFound):
        await _infer(plane, "nothere")
    with pytest.raises(ModelNotFound):
        await _infer(plane, "../repo")


async def test_an_idle_model_is_unloaded_and_its_next_request_loads_it_again(repo, make_plane):
    plane, registry, events = await make_plane(ResidencyRules(load_on_demand=True, idle_unload_secs=0.05))
    await _infer(plane, "a")
    await _infer(plane, "lazy")
    residency = registry.residency
    await _unload_idle_until_gone(registry)
    assert sorted(_residency(events, "unload")) == [("a", "idle"), ("lazy", "idle")]
    row = next(r for r in plane.repository_index() if r.name == "a")
    assert "idle_unload_secs" in row.reason and "next request" in row.reason
    await _infer(plane, "a")
    assert residency.loads[("a", "demand")] == 2


async def test_a_models_own_idle_unload_secs_overrides_the_servers(repo, make_plane):
    plane, registry, _ = await make_plane(ResidencyRules(load_on_demand=True, idle_unload_secs=3600))
    await _infer(plane, "a")
    await _infer(plane, "lazy")
    await _unload_idle_until_gone(registry, "lazy")
    assert _loaded(registry) == {"a"}


async def test_pinned_and_held_models_are_never_unloaded_for_idleness(repo, make_plane):
    plane, registry, _ = await make_plane(ResidencyRules(load_on_demand=True, idle_unload_secs=0.01),
                                          load=("a", "held"))
    registry.residency.pin(["a"])  # as --load-model does
    await _infer(plane, "b", scale=2.0)
    with registry.get("b").in_use():  # a request (or a BLS caller) holds it
        await asyncio.sleep(0.05)
        assert await registry.residency.unload_idle() == []
    assert _loaded(registry) == {"a", "b", "held"}
    await _unload_idle_until_gone(registry, "b")
    assert _loaded(registry) == {"a", "held"}


async def test_the_budget_unloads_the_least_recently_used_idle_model(repo, make_plane):
    plane, registry, events = await make_plane(ResidencyRules(load_on_demand=True, budget_bytes=100 * MIB))
    for model in ("a", "b", "c", "a", "b"):
        await _infer(plane, model, scale=" abc".index(model))
        assert registry.residency.used() <= 100 * MIB
        assert len(_loaded(registry)) <= 2
    assert _residency(events, "unload") == [("a", "budget"), ("b", "budget"), ("c", "budget")]
    assert _loaded(registry) == {"a", "b"}


async def test_a_model_larger_than_the_budget_is_refused_with_its_size(repo, make_plane):
    plane, registry, _ = await make_plane(ResidencyRules(load_on_demand=True, budget_bytes=100 * MIB))
    await _infer(plane, "a")
    with pytest.raises(InsufficientStorage, match=r"'big' needs about 200 MiB .* budget is 100 MiB"):
        await _infer(plane, "big")
    assert _loaded(registry) == {"a"}  # nothing was unloaded for a model that could never fit
    assert plane.ready()


async def test_a_first_load_whose_guess_exceeds_the_budget_loads_alone_rather_than_refused(repo, make_plane):
    plane, registry, events = await make_plane(ResidencyRules(load_on_demand=True, budget_bytes=30 * MIB))
    with pytest.raises(InsufficientStorage, match="needs about 40 MiB"):
        await _infer(plane, "a")  # what it says it needs does not fit
    await _infer(plane, "plain")  # onnxruntime's base (32 MiB) is a guess: its files are a few KiB
    assert _loaded(registry) == {"plain"}
    assert registry.residency.memory()["plain"] < 30 * MIB


async def test_a_load_that_cannot_fit_beside_busy_models_is_refused_after_the_timeout(repo, make_plane):
    plane, registry, _ = await make_plane(ResidencyRules(load_on_demand=True, budget_bytes=100 * MIB,
                                                         load_timeout=0.2))
    await _infer(plane, "a")
    await _infer(plane, "b", scale=2.0)
    with (registry.get("a").in_use(), registry.get("b").in_use(),
          pytest.raises(InsufficientStorage, match="busy or pinned")):
        await registry.load("c")
    assert _loaded(registry) == {"a", "b"}


async def test_the_load_api_is_under_the_budget_too(repo, make_plane):
    plane, registry, events = await make_plane(ResidencyRules(budget_bytes=100 * MIB))
    for model in ("a", "b", "c"):
        await registry.load(model)
    assert _loaded(registry) == {"b", "c"}
    assert _residency(events, "load") == [("a", "explicit"), ("b", "explicit"), ("c", "explicit")]
    assert _residency(events, "unload") == [("a", "budget")]


async def test_memory_pressure_unloads_the_least_recently_used_idle_model(repo, make_plane, monkeypatch):
    readings = [Pressure(2.0, None)]
    plane, registry, events = await make_plane(ResidencyRules(load_on_demand=True, pressure_threshold=10.0))
    monkeypatch.setattr(registry.residency, "_pressure", lambda: readings[-1])
    await _infer(plane, "a")
    await _infer(plane, "b", scale=2.0)
    assert await registry.residency.relieve_pressure() is None
    readings.append(Pressure(35.5, None))
    assert await registry.residency.relieve_pressure() == "a"
    assert _loaded(registry) == {"b"}
    assert _residency(events, "unload") == [("a", "pressure")]


async def test_a_cgroup_going_over_memory_high_counts_as_pressure(repo, make_plane, monkeypatch):
    readings = [Pressure(None, 3)]
    plane, registry, _ = await make_plane(ResidencyRules(load_on_demand=True, pressure_threshold=10.0))
    monkeypatch.setattr(registry.residency, "_pressure", lambda: readings[-1])
    await _infer(plane, "a")
    assert await registry.residency.relieve_pressure() is None  # the first reading is the baseline
    readings.append(Pressure(None, 4))
    assert await registry.residency.relieve_pressure() == "a"


async def test_a_measurement_is_kept_for_the_next_loads_estimate(repo, make_plane, tmp_path):
    book = tmp_path / "memory.json"
    plane, registry, events = await make_plane(ResidencyRules(load_on_demand=True, book=book))
    await _infer(plane, "a")
    kept = json.loads(book.read_text())
    assert kept["a"] >= 40 * MIB  # never below what the config says it needs
    assert registry.residency.memory()["a"] == kept["a"]
    book.write_text(json.dumps({"a": 90 * MIB, "b": "junk"}))
    _, again, events = await make_plane(ResidencyRules(load_on_demand=True, book=book, budget_bytes=80 * MIB))
    with pytest.raises(InsufficientStorage, match=r"needs about 90 MiB \(measured at its last load\)"):
        await again.load("a")


def _message(model: str, timeout_us: int) -> pb.ModelInferRequest:
    """A gRPC ModelInferRequest of x = ones carrying Triton's ``timeout`` parameter."""
    message = pb.ModelInferRequest(model_name=model)
    message.inputs.add(name="x", datatype="FP32", shape=[1, WIDTH])
    message.raw_input_contents.append(np.ones((1, WIDTH), dtype=np.float32).tobytes())
    message.parameters["timeout"].int64_param = timeout_us
    return message


async def test_the_index_says_why_each_model_is_loaded_or_not_and_what_it_holds(repo, make_plane):
    plane, registry, _ = await make_plane(ResidencyRules(load_on_demand=True, idle_unload_secs=3600),
                                          load=("a", "held"))
    registry.residency.pin(["a"])  # as --load-model does
    await _infer(plane, "b", scale=2.0)
    await _infer(plane, "lazy")
    await _unload_idle_until_gone(registry, "lazy")
    rows = {row.name: row.as_json() for row in plane.repository_index()}
    assert rows["a"]["load_cause"] == "start" and rows["a"]["pinned"] is True
    assert rows["held"]["load_cause"] == "start" and rows["held"]["pinned"] is True  # its config pins it
    assert rows["b"]["load_cause"] == "demand" and "pinned" not in rows["b"]
    assert all(rows[m]["memory_bytes"] >= 40 * MIB for m in ("a", "held", "b"))  # never below memory_mib
    assert rows["lazy"]["state"] == "UNAVAILABLE" and rows["lazy"]["unload_cause"] == "idle"
    assert "memory_bytes" not in rows["lazy"] and "load_cause" not in rows["lazy"]
    assert {"load_cause", "unload_cause", "memory_bytes"}.isdisjoint(rows["c"])  # never loaded
    memory = plane.memory()
    assert memory["budget_bytes"] is None and memory["load_on_demand"] is True
    assert memory["models"]["b"] == rows["b"]["memory_bytes"]
    assert memory["load_causes"] == {"a": "start", "b": "demand", "held": "start"}
    assert memory["unload_causes"] == {"lazy": "idle"}
    await _infer(plane, "lazy")  # loaded again: the unload is history
    row = next(r.as_json() for r in plane.repository_index() if r.name == "lazy")
    assert row["load_cause"] == "demand" and "unload_cause" not in row
    await registry.load("c")  # the load API
    assert next(r for r in plane.repository_index() if r.name == "c").load_cause == "explicit"


async def test_without_residency_the_index_rows_are_tritons(repo, make_plane):
    plane, _, _ = await make_plane(ResidencyRules(), load=("a",))
    rows = {row.name: row.as_json() for row in plane.repository_index()}
    assert rows["a"] == {"name": "a", "version": "1", "state": "READY", "origin": "repository"}
    assert plane.memory()["active"] is False


async def test_metadata_of_a_model_not_loaded_says_that_a_request_loads_it(repo, make_plane):
    plane, registry, _ = await make_plane(ResidencyRules(load_on_demand=True))
    with pytest.raises(ModelNotFound, match=r"^Request for unknown model: 'a' has no available versions; not loaded: "
                                            r"loads on its first request \(load_on_demand\)$"):
        plane.model_metadata("a")
    await _infer(plane, "a")
    await registry.unload("a")  # as the unload API does
    for read in (plane.model_metadata, plane.model_config):
        with pytest.raises(ModelNotFound, match=r"^Request for unknown model: 'a' has no available versions; "
                                                r"unloaded; it is in the repository, not loaded: an inference "
                                                r"request loads it \(load_on_demand\)$"):
            read("a")
    with pytest.raises(ModelNotFound, match=r"^Request for unknown model: 'nothere' is not found$"):
        plane.model_metadata("nothere")
    plain, registry, _ = await make_plane(ResidencyRules())
    with pytest.raises(ModelNotFound) as refused:
        plain.model_metadata("a")
    assert "load_on_demand" not in refused.value.message


async def test_a_requests_own_timeout_bounds_its_wait_for_the_load(repo, make_plane, monkeypatch):
    plane, registry, _ = await make_plane(ResidencyRules(load_on_demand=True, load_timeout=5))
    release = asyncio.Event()
    load = registry.load

    async def slow_load(name, *args, **kwargs):
        await release.wait()
        return await load(name, *args, **kwargs)

    monkeypatch.setattr(registry, "load", slow_load)
    patient = asyncio.ensure_future(_infer(plane, "b", scale=2.0))
    with pytest.raises(Unavailable, match=r"still loading on demand after the request's timeout \(0.05 s"):
        async with plane.infer(LOCAL, InferMessage(message=_message("b", timeout_us=50_000))):
            pass
    assert not patient.done()  # the load goes on for the requests still waiting
    release.set()
    await patient
    async with plane.infer(LOCAL, InferMessage(message=_message("b", timeout_us=50_000))) as result:
        np.testing.assert_allclose(result.response.outputs[0].data, np.full((1, WIDTH), 2.0))
    assert registry.residency.loads[("b", "demand")] == 1
