"""BoxPool and AsyncBoxPool against real daemons (fixed boxes, no mDNS), over HTTP and gRPC: 8 threads,
a model only one box has, and an error a box answered that is not retried."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from appliance.client import AsyncBoxPool, Box, BoxPool
from tests.builders import affine_model, write_model
from tests.http_util import call

MODULES = {"http": triton_http, "grpc": triton_grpc}
PROTOCOLS = ["http", "grpc"]


@pytest.fixture(scope="module")
def boxes(module_daemon, tmp_path_factory):
    """(daemons, fleet): two boxes with 'affine' (y = 2x + 1) and the accumulator 'acc' (OUTPUT = the running
    sum of the sequence's INPUTs, state kept by each daemon: a sequence must stay on one box to add up); only
    box b also has 'only_b' (y = 5x). One pair serves every test: daemons are the slow part."""
    from appliance.examples.sequence import accumulator_config, accumulator_model, write_sequence_model

    repo_a, repo_b = tmp_path_factory.mktemp("repo-a"), tmp_path_factory.mktemp("repo-b")
    for repo in (repo_a, repo_b):
        write_model(repo, "affine", affine_model(2, 1))
        write_sequence_model(repo, "acc", accumulator_model(), accumulator_config(idle_us=60_000_000))
    write_model(repo_b, "only_b", affine_model(5, 0))
    daemons = [module_daemon(repo_a), module_daemon(repo_b)]
    return daemons, [Box(name=n, addresses=("127.0.0.1",), port=d.port, grpc_port=d.grpc_port)
                     for n, d in zip("ab", daemons)]


def _tensor(protocol: str, value: float, width: int = 8):
    tensor = MODULES[protocol].InferInput("x", [1, width], "FP32")
    tensor.set_data_from_numpy(np.full((1, width), value, np.float32))
    return tensor


def _fails(daemon) -> int:
    rows = call(daemon.port, "GET", "/v2/models/affine/stats")[2]["model_stats"]
    return sum(row["inference_stats"]["fail"]["count"] for row in rows)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_eight_threads_through_one_pool(boxes, protocol):
    _, fleet = boxes
    with BoxPool(fleet, protocol) as pool:
        def one(index: int) -> tuple[float, float]:
            model = "only_b" if index % 5 == 0 else "affine"
            value = float(pool.infer(model, [_tensor(protocol, index)]).as_numpy("y")[0, 0])
            return value, (5.0 * index if model == "only_b" else 2.0 * index + 1)

        with ThreadPoolExecutor(8) as executor:
            answers = list(executor.map(one, range(400)))
        stats = pool.stats()
    assert all(value == expected for value, expected in answers)
    assert "only_b" not in stats["a"]["served"] and stats["b"]["served"]["only_b"] == 80
    assert stats["a"]["served"]["affine"] > 0 and stats["b"]["served"]["affine"] > 0
    assert all(s["outstanding"] == 0 and s["failed"] == 0 for s in stats.values())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_error_the_box_answered_reaches_the_caller_once(boxes, protocol):
    daemons, fleet = boxes
    before = sum(_fails(d) for d in daemons)
    with BoxPool(fleet, protocol) as pool:
        with pytest.raises(InferenceServerException) as excinfo:
            pool.infer("affine", [_tensor(protocol, 1.0, width=3)])  # the model takes [batch, 8]
        stats = pool.stats()
    assert excinfo.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    assert sum(s["failed"] for s in stats.values()) == 1  # sent once, to one box, not retried
    assert sum(sum(s["served"].values()) for s in stats.values()) == 0
    assert sum(_fails(d) for d in daemons) - before <= 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_many_tasks_through_one_async_pool(boxes, protocol):
    _, fleet = boxes

    async def main():
        async with AsyncBoxPool(fleet, protocol) as pool:
            results = await asyncio.gather(*(pool.infer("affine", [_tensor(protocol, i)]) for i in range(200)))
            return [float(r.as_numpy("y")[0, 0]) for r in results], pool.stats()

    values, stats = asyncio.run(main())
    assert values == [2.0 * i + 1 for i in range(200)]
    assert all(s["outstanding"] == 0 for s in stats.values())
    assert sum(s["served"]["affine"] for s in stats.values()) == 200


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_each_sequence_stays_on_one_box_and_adds_up(boxes, protocol):
    module = MODULES[protocol]
    _, fleet = boxes
    steps = 6

    def run(sequence: int) -> list[int]:
        sums = []
        for step in range(steps):
            tensor = module.InferInput("INPUT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[sequence + step]], np.int32))
            result = pool.infer("acc", [tensor], sequence_id=1000 + sequence, sequence_start=step == 0,
                                sequence_end=step == steps - 1)
            sums.append(int(result.as_numpy("OUTPUT")[0, 0]))
        return sums

    with BoxPool(fleet, protocol) as pool, ThreadPoolExecutor(8) as executor:
        got = list(executor.map(run, range(16)))
        stats = pool.stats()
    expected = [list(np.cumsum([s + step for step in range(steps)])) for s in range(16)]
    assert got == expected  # a step sent to the other box would restart from 0 or be refused
    assert all(stats[n]["served"].get("acc", 0) > 0 for n in "ab")  # sequences spread over both boxes
