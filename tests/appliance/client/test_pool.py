"""BoxPool and AsyncBoxPool against fake boxes: what is retried on another box and what is not, boxes
without the model, and many threads (or tasks) at once."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from appliance.client import AsyncBoxPool, BoxPool, NoBoxAvailable
from tests.appliance.client.fake_boxes import dead_box, fake_boxes


def _inputs() -> list:
    tensor = triton.InferInput("x", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, np.float32))
    return [tensor]


def _who(result) -> str:
    value = result.as_numpy("who")[0]
    return value.decode() if isinstance(value, bytes) else str(value)


@pytest.fixture(params=["sync", "async"])
def infer(request):
    """infer(boxes, model, **pool_options) -> (answer or exception, pool stats), through either pool."""

    def sync(boxes, model, **options):
        with BoxPool(boxes, **options) as pool:
            try:
                return _who(pool.infer(model, _inputs())), pool.stats()
            except Exception as exc:  # noqa: BLE001 - the test looks at it
                return exc, pool.stats()

    def run_async(boxes, model, **options):
        async def main():
            async with AsyncBoxPool(boxes, **options) as pool:
                try:
                    return _who(await pool.infer(model, _inputs())), pool.stats()
                except Exception as exc:  # noqa: BLE001
                    return exc, pool.stats()

        return asyncio.run(main())

    return sync if request.param == "sync" else run_async


def test_a_503_goes_to_another_box(infer):
    with fake_boxes(("full", {"m"}, "503"), ("idle", {"m"}, "ok")) as (full, idle):
        for _ in range(30):  # a fresh pool each time: until one picks the full box first
            answer, stats = infer([full.box, idle.box], "m")
            assert answer == "idle"
            if full.total():
                break
        assert full.total() >= 1 and stats["full"]["refused"] == 1  # refused, then retried on idle
        assert stats["full"]["served"] == {}


@pytest.mark.parametrize("status", ["500", "400"])
def test_an_error_the_box_answered_is_never_retried(infer, status):
    with fake_boxes(("broken", {"m"}, status), ("other", {"m"}, "ok")) as (broken, other):
        for _ in range(30):  # a fresh pool each time: until one sends it to the broken box
            answer, stats = infer([broken.box, other.box], "m")
            if isinstance(answer, Exception):
                break
        assert isinstance(answer, InferenceServerException)
        assert f"broken says {status}" in answer.message() and answer.status() == status
        assert stats["broken"]["failed"] == 1 and stats["other"]["served"] == {}


def test_a_box_that_does_not_answer_is_skipped_and_cooled(infer):
    with fake_boxes(("alive", {"m"}, "ok")) as (alive,):
        dead = dead_box()
        for _ in range(4):
            answer, stats = infer([dead, alive.box], "m")
            assert answer == "alive"


def test_a_box_without_the_model_gets_none_of_its_requests():
    with fake_boxes(("with", {"m"}, "ok"), ("without", {"other"}, "ok")) as (with_model, without):
        with BoxPool([with_model.box, without.box]) as pool:
            answers = {_who(pool.infer("m", _inputs())) for _ in range(50)}
        assert answers == {"with"} and without.hits == {}


def test_a_404_means_the_box_lost_the_model_and_goes_elsewhere():
    with fake_boxes(("stale", {"m"}, "404"), ("fresh", {"m"}, "ok")) as (stale, fresh), \
            BoxPool([stale.box, fresh.box]) as pool:
        stale.models = set()  # unloaded since the pool read its index
        assert {_who(pool.infer("m", _inputs())) for _ in range(20)} == {"fresh"}
        assert stale.total() <= 1  # dropped from its candidates after the first 404


def test_a_model_no_box_has_is_refused_at_once():
    with fake_boxes(("a", {"m"}, "ok")) as (a,), BoxPool([a.box], retry_deadline=30) as pool, \
            pytest.raises(NoBoxAvailable, match="'nope'"):
        pool.infer("nope", _inputs())


def test_every_box_full_until_the_deadline_is_an_error():
    with fake_boxes(("a", {"m"}, "503"), ("b", {"m"}, "503")) as (a, b):
        with BoxPool([a.box, b.box], retry_deadline=1.0) as pool, \
                pytest.raises(NoBoxAvailable, match="queue full"):
            pool.infer("m", _inputs())
        assert a.total() >= 2 and b.total() >= 2  # tried again after their Retry-After


def test_eight_threads_share_one_pool():
    """The pool's own state and its HTTP connections are shared by every thread: 8 threads x 100
    requests all answered, spread over both boxes, nothing left outstanding."""
    with fake_boxes(("a", {"m"}, "ok"), ("b", {"m"}, "ok")) as boxes:
        for box in boxes:
            box.delay = 0.002
        with BoxPool([b.box for b in boxes]) as pool:
            barrier = threading.Barrier(8)

            def work(_: int) -> list[str]:
                barrier.wait()
                return [_who(pool.infer("m", _inputs())) for _ in range(100)]

            with ThreadPoolExecutor(8) as executor:
                answers = [a for chunk in executor.map(work, range(8)) for a in chunk]
            stats = pool.stats()
        assert len(answers) == 800
        assert sum(s["served"].get("m", 0) for s in stats.values()) == 800
        assert all(s["outstanding"] == 0 for s in stats.values())
        assert boxes[0].total() + boxes[1].total() == 800
        assert min(boxes[0].total(), boxes[1].total()) > 200


def test_many_tasks_share_one_async_pool():
    with fake_boxes(("a", {"m"}, "ok"), ("b", {"m"}, "ok")) as boxes:
        for box in boxes:
            box.delay = 0.002

        async def main():
            async with AsyncBoxPool([b.box for b in boxes]) as pool:
                answers = await asyncio.gather(*(pool.infer("m", _inputs()) for _ in range(400)))
                return [_who(a) for a in answers], pool.stats()

        answers, stats = asyncio.run(main())
        assert len(answers) == 400 and set(answers) == {"a", "b"}
        assert all(s["outstanding"] == 0 for s in stats.values())
        assert min(boxes[0].total(), boxes[1].total()) > 100
