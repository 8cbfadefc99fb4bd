"""The rate limiter: its settings and registration (Triton's refusals), and real schedulers of several
models running under it: resources held exclusively, priorities weighting the turns, statistics.

Executions are recorded by the backends themselves (start and end on the instance thread); time appears
only as sleeps that hold an instance busy."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.core.errors import ConfigError
from appliance.engine.instances import InstancePool
from appliance.engine.rate_limiter import InstanceNeeds, RateLimitCounts, RateLimiter, instance_needs
from appliance.engine.scheduler import Scheduler, SchedulerPolicy, SequenceScheduler, sequence_policy
from appliance.engine.shared_config import ResourceLimit
from appliance.engine.stats import ModelStats
from tests.fakes import TensorlessBackend
from tests.waiting import await_until


@pytest.mark.parametrize("text, limit", [
    ("R1:4", ResourceLimit("r1", 4)),
    ("gpu_mem:2:1", ResourceLimit("gpu_mem", 2, 1)),
])
def test_resource_flags_are_tritons(text, limit):
    assert ResourceLimit.parse(text) == limit


@pytest.mark.parametrize("text", ["R1", "R1:x", "R1:1:2:3", ":4", "R1:-1"])
def test_bad_resource_flags_show_the_format(text):
    with pytest.raises(ConfigError, match="<resource_name>:<count>"):
        ResourceLimit.parse(text)


def test_instances_take_their_groups_needs_and_devices():
    config = text_format.Parse("""
        instance_group [
          { count: 1 kind: KIND_CPU rate_limiter { resources [{ name: "R1" count: 2 }] } },
          { count: 3 kind: KIND_GPU gpus: [0, 1]
            rate_limiter { resources [{ name: "G" global: true count: 1 }] priority: 3 } }
        ]""", mc.ModelConfig())
    needs = instance_needs(config, 4)
    assert needs[0] == InstanceNeeds(0, (("R1", False, 2),), 1)  # priority 0 counts as 1
    assert [n.device for n in needs[1:]] == [0, 1, 0] and {n.priority for n in needs[1:]} == {3}
    assert instance_needs(mc.ModelConfig(), 2) == [InstanceNeeds(0), InstanceNeeds(0)]


def _needs(*resources: tuple[str, bool, int], priority: int = 1, device: int = 0) -> list[InstanceNeeds]:
    return [InstanceNeeds(device, resources, priority)]


def test_resources_default_to_the_most_any_instance_needs():
    limiter = RateLimiter()
    limiter.register("a:1", _needs(("R1", False, 4), ("R2", False, 4)), RateLimitCounts())
    limiter.register("b:1", _needs(("R2", False, 5), ("R3", True, 10)), RateLimitCounts())
    assert {(r["name"], r["device"]): r["capacity"] for r in limiter.resources()} == {
        ("R1", "0"): 4, ("R2", "0"): 5, ("R3", "global"): 10}


def test_listed_resources_must_cover_every_instance_in_tritons_words():
    limiter = RateLimiter([ResourceLimit("resource1", 3), ResourceLimit("resource2", 2)])
    with pytest.raises(ConfigError, match='Resource count for "resource1" is limited to 3 which will prevent '
                                          "scheduling of one or more model instances, the minimum required "
                                          "count is 4"):
        limiter.register("a:1", _needs(("resource1", False, 4)), RateLimitCounts())
    assert limiter.resources() == []  # nothing of the refused model stays registered


def test_a_resource_listed_for_another_device_is_not_available():
    limiter = RateLimiter([ResourceLimit("resource1", 10, 10), ResourceLimit("resource2", 2)])
    with pytest.raises(ConfigError, match='"Resource1" is limited to 0'):
        limiter.register("a:1", _needs(("Resource1", False, 4)), RateLimitCounts())
    limits = limiter.register("b:1", _needs(("RESOURCE2", True, 2)), RateLimitCounts())  # names match in any case
    assert limiter.resources() == [{"name": "RESOURCE2", "device": "global", "capacity": 2, "in_use": 0}]
    limits.close()
    assert limiter.resources() == []


def test_one_name_cannot_be_global_and_per_device():
    limiter = RateLimiter()
    limiter.register("a:1", _needs(("resource2", True, 2)), RateLimitCounts())
    with pytest.raises(ConfigError, match='Resource "resource2" is present as both global and device-specific '
                                          "resource in the model configuration"):
        limiter.register("b:1", _needs(("resource2", False, 2)), RateLimitCounts())


class Recorder(TensorlessBackend):
    """An instance that records when each execution starts and ends (monotonic, on its own thread)."""

    def __init__(self, name: str, log: list[tuple[str, float, float]], delay: float) -> None:
        self.name, self.log, self.delay = name, log, delay
        self.lock = threading.Lock()

    def run(self, inputs, outputs):
        start = time.monotonic()
        time.sleep(self.delay)
        with self.lock:
            self.log.append((self.name, start, time.monotonic()))
        return {name: inputs["x"] for name in (outputs or ["y"])}


@pytest.fixture
def models(started):
    """models(limiter, name, needs, log) -> a started scheduler of Recorder instances, closed after the test."""

    def make(limiter: RateLimiter | None, name: str, needs: list[InstanceNeeds], log: list,
             delay: float = 0.01) -> Scheduler:
        backends = [Recorder(name, log, delay) for _ in needs]
        stats = ModelStats()
        limits = None
        if limiter is not None:
            stats.rate_limiter = RateLimitCounts()
            limits = limiter.register(f"{name}:1", needs, stats.rate_limiter)
        return started(Scheduler(f"{name}:1", InstancePool(f"{name}:1", backends, limits),
                                 SchedulerPolicy(max_batch_size=0), stats))

    return make


async def _saturate(scheduler: Scheduler, count: int) -> list[asyncio.Task]:
    return [asyncio.ensure_future(scheduler.submit({"x": np.zeros(1, np.float32)}, ["y"], 1, {}))
            for _ in range(count)]


def _overlaps(log: list[tuple[str, float, float]]) -> int:
    spans = sorted((start, end) for _, start, end in log)
    return sum(1 for (_, end), (start, _) in zip(spans, spans[1:]) if start < end)


async def test_two_models_sharing_one_resource_never_execute_at_once(models):
    log: list = []
    limiter = RateLimiter()
    a = models(limiter, "a", _needs(("accelerator", False, 1)), log)
    b = models(limiter, "b", _needs(("accelerator", False, 1)), log)
    await asyncio.gather(*await _saturate(a, 12), *await _saturate(b, 12))
    assert len(log) == 24 and _overlaps(log) == 0
    assert a.stats.rate_limiter.waits > 0 and b.stats.rate_limiter.waits > 0
    assert a.stats.as_json()["rate_limiter_stats"]["executions"] == 12


async def test_without_the_rate_limiter_the_same_models_do_overlap(models):
    # What the test above rules out, shown happening when nothing limits them (so that test can fail).
    log: list = []
    a = models(None, "a", _needs(), log, delay=0.03)
    b = models(None, "b", _needs(), log, delay=0.03)
    await asyncio.gather(*await _saturate(a, 4), *await _saturate(b, 4))
    assert _overlaps(log) > 0


async def test_priority_two_gets_half_the_turns_of_priority_one(models):
    log: list = []
    limiter = RateLimiter()
    first = models(limiter, "first", _needs(("R", False, 1), priority=1), log)
    second = models(limiter, "second", _needs(("R", False, 1), priority=2), log)
    tasks = [*await _saturate(first, 40), *await _saturate(second, 40)]
    # both stay saturated over the first 30 executions
    await await_until(lambda: len(log) >= 30, timeout=60, what="30 executions")
    window = [name for name, _, _ in sorted(log, key=lambda e: e[1])[:30]]
    ratio = window.count("first") / window.count("second")
    assert 1.6 <= ratio <= 2.5, window
    await asyncio.gather(*tasks)
    assert _overlaps(log) == 0


async def test_a_global_resource_is_shared_across_devices_and_a_device_one_is_not(models):
    log: list = []
    limiter = RateLimiter()
    on0 = models(limiter, "on0", _needs(("local", False, 1), device=0), log, delay=0.03)
    on1 = models(limiter, "on1", _needs(("local", False, 1), device=1), log, delay=0.03)
    await asyncio.gather(*await _saturate(on0, 4), *await _saturate(on1, 4))
    assert _overlaps(log) > 0  # one copy per device: the two devices run together
    log.clear()
    g0 = models(limiter, "g0", _needs(("shared", True, 1), device=0), log)
    g1 = models(limiter, "g1", _needs(("shared", True, 1), device=1), log)
    await asyncio.gather(*await _saturate(g0, 8), *await _saturate(g1, 8))
    assert _overlaps(log) == 0


async def test_more_copies_let_that_many_run_together(models):
    log: list = []
    limiter = RateLimiter([ResourceLimit("r", 2)])
    schedulers = [models(limiter, name, _needs(("r", False, 1)), log, delay=0.03) for name in "abc"]
    tasks = [task for s in schedulers for task in await _saturate(s, 4)]
    busy = 0

    def sample() -> bool:  # the copies in use, seen every 2 ms until every request is answered
        nonlocal busy
        busy = max(busy, sum(1 for r in limiter.resources() for _ in range(r["in_use"])))
        return all(t.done() for t in tasks)

    await await_until(sample, timeout=60, interval=0.002, what="every request answered")
    await asyncio.gather(*tasks)
    assert busy == 2


async def test_a_closed_model_gives_up_its_claim(models):
    log: list = []
    limiter = RateLimiter()
    big = models(limiter, "big", _needs(("r", False, 3)), log)
    small = models(limiter, "small", _needs(("r", False, 1)), log)
    assert limiter.resources()[0]["capacity"] == 3
    await big.close()
    assert limiter.resources()[0]["capacity"] == 1
    await asyncio.gather(*await _saturate(small, 3))
    assert len(log) == 3


SEQUENCE = """
name: "stateful"
max_batch_size: 1
input [{ name: "x" data_type: TYPE_FP32 dims: [1] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [1] }]
sequence_batching {
  control_input [{ name: "START" control [{ kind: CONTROL_SEQUENCE_START fp32_false_true: [0, 1] }] }]
}
"""


class SequenceRecorder(Recorder):
    def run(self, inputs, outputs):
        return super().run({"x": inputs["x"]}, ["y"])


async def test_a_sequence_model_waits_for_the_resource_too(models, started, tmp_path):
    log: list = []
    limiter = RateLimiter()
    plain = models(limiter, "plain", _needs(("r", False, 1)), log)
    config = text_format.Parse(SEQUENCE, mc.ModelConfig())
    stats = ModelStats()
    limits = limiter.register("stateful:1", _needs(("r", False, 1)), RateLimitCounts())
    sequences = started(SequenceScheduler(
        "stateful:1", "stateful", InstancePool("stateful:1", [SequenceRecorder("stateful", log, 0.01)], limits),
        sequence_policy(config, tmp_path), stats))
    steps = [asyncio.ensure_future(sequences.submit(
        {"x": np.zeros((1, 1), np.float32)}, ["y"], 1,
        {"sequence_id": 7, "sequence_start": index == 0})) for index in range(6)]
    await asyncio.gather(*await _saturate(plain, 6), *steps)
    assert sum(1 for name, _, _ in log if name == "stateful") == 6 and _overlaps(log) == 0
