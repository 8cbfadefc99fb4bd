"""Iterative sequences (``sequence_batching { iterative_sequence: true }``) through the sequence batcher's
public API, with a countdown backend that releases each request with RESCHEDULE until it is done, as a
token-by-token model does: every request is a sequence of its own, rescheduled requests batch with new
ones (continuous batching), a completed request ends its sequence and frees its slot."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends.base import RESCHEDULE, BatchResult
from appliance.core.errors import InvalidInput
from appliance.engine.instances import InstancePool
from appliance.engine.scheduler import SequenceScheduler, sequence_policy
from appliance.engine.stats import ModelStats
from tests.appliance.backends.python.harness import RecordingSink
from tests.fakes import RequestsBackend
from tests.waiting import await_until


class Countdown(RequestsBackend):
    """Each request asks for N steps (input STEPS); every step answers REMAINING (N - steps done so far)
    and is rescheduled until it reaches 0, the state kept per correlation ID as a Python model keeps it.
    Records every batch as (correlation ID, flags, START control) rows."""

    def __init__(self, delay: float = 0.0, sends: bool = False) -> None:
        self.delay = delay
        self.sends = sends
        self.left: dict = {}
        self.batches: list[list[tuple]] = []
        self._lock = threading.Lock()

    def run_requests(self, requests):
        time.sleep(self.delay)
        rows, results = [], []
        for request in requests:
            if request.correlation_id == 0:  # direct: an empty slot's padding row
                results.append({})
                continue
            rows.append((request.correlation_id, request.flags, int(request.inputs["START"].reshape(-1)[0])))
            if request.flags & 1:
                self.left[request.correlation_id] = int(request.inputs["STEPS"].reshape(-1)[0])
            self.left[request.correlation_id] -= 1
            remaining = self.left[request.correlation_id]
            outputs = {"REMAINING": np.array([[remaining]], np.int32)}
            if request.sink is not None:
                request.sink.send(outputs, final=remaining <= 0)
                outputs = {}
            results.append(RESCHEDULE if remaining > 0 else outputs)
        with self._lock:
            self.batches.append(rows)
        return BatchResult(results)


CONFIG = """
max_batch_size: {batch}
input [ {{ name: "STEPS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "REMAINING" data_type: TYPE_INT32 dims: [ 1 ] }} ]
sequence_batching {{
  iterative_sequence: {iterative}
  max_sequence_idle_microseconds: 5000000
  control_input [ {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }} ]
  {strategy}
}}
"""


@pytest.fixture
def make(started):
    def build(backend: Countdown, batch: int = 4, iterative: bool = True,
              strategy: str = "direct { }") -> SequenceScheduler:
        config = text_format.Parse(CONFIG.format(batch=batch, iterative=str(iterative).lower(), strategy=strategy),
                                   mc.ModelConfig())
        config.name = "countdown"
        return started(SequenceScheduler("countdown:1", "countdown", InstancePool("countdown:1", [backend]),
                                         sequence_policy(config, None), ModelStats()))

    return build


def ask(scheduler: SequenceScheduler, steps: int, parameters: dict | None = None, sink=None) -> asyncio.Task:
    return asyncio.ensure_future(scheduler.submit({"STEPS": np.array([[steps]], np.int32)}, ["REMAINING"], 1,
                                                  parameters or {}, sink=sink))


async def test_a_request_runs_until_the_model_stops_rescheduling_it(make):
    backend = Countdown()
    scheduler = make(backend)
    result = await ask(scheduler, 3)
    assert result["REMAINING"].tolist() == [[0]]
    # One sequence of its own (a fresh ID, START on the first step only), three steps.
    assert [row for batch in backend.batches for row in batch] == [(1, 1, 1), (1, 0, 0), (1, 0, 0)]
    counts = scheduler.stats.sequences
    assert counts.started == 1 and counts.ended == 1 and counts.active == 0
    assert scheduler.pending == 0


async def test_rescheduled_requests_batch_with_new_ones(make):
    backend = Countdown(delay=0.02)
    scheduler = make(backend, batch=4)
    first = [ask(scheduler, steps) for steps in (2, 5, 3)]
    # the first batch ran: a newcomer joins those still going
    await await_until(lambda: backend.batches, what="the first batch run")
    late = ask(scheduler, 2)
    results = await asyncio.gather(*first, late)
    assert [r["REMAINING"].tolist() for r in results] == [[[0]]] * 4
    sizes = [len(batch) for batch in backend.batches]
    assert sizes[0] == 3 and max(sizes) <= 4
    assert sum(sizes) == 2 + 5 + 3 + 2  # every step ran once
    # Continuous batching: a batch held the newcomer's first step beside steps rescheduled earlier.
    assert any(any(flags & 1 for _, flags, _ in batch) and any(flags == 0 for _, flags, _ in batch)
               for batch in backend.batches[1:])
    assert len({corrid for batch in backend.batches for corrid, _, _ in batch}) == 4
    assert scheduler.stats.sequences.ended == 4 and scheduler.stats.sequences.active == 0


async def test_more_requests_than_slots_wait_in_the_backlog(make):
    backend = Countdown(delay=0.005)
    scheduler = make(backend, batch=1)
    results = await asyncio.gather(*(ask(scheduler, 3) for _ in range(4)))
    assert all(r["REMAINING"].tolist() == [[0]] for r in results)
    assert all(len(batch) == 1 for batch in backend.batches) and len(backend.batches) == 12
    # One slot: a sequence runs all its steps before the backlog's next one gets the slot.
    order = [batch[0][0] for batch in backend.batches]
    assert order == sorted(order)


async def test_a_client_sequence_id_is_kept_and_ends_with_its_request(make):
    backend = Countdown()
    scheduler = make(backend)
    await ask(scheduler, 2, {"sequence_id": 42, "sequence_start": True})
    assert [row[0] for batch in backend.batches for row in batch] == [42, 42]
    with pytest.raises(InvalidInput, match="must specify the START flag on the first request of the sequence"):
        await ask(scheduler, 2, {"sequence_id": 42})


async def test_fresh_ids_skip_the_ones_in_use(make):
    backend = Countdown(delay=0.01)
    scheduler = make(backend)
    held = ask(scheduler, 3, {"sequence_id": 1, "sequence_start": True})
    await await_until(lambda: scheduler.stats.sequences.started == 1, interval=0, what="sequence 1 open")
    await asyncio.gather(held, ask(scheduler, 1))
    assert {row[0] for batch in backend.batches for row in batch} == {1, 2}


async def test_decoupled_steps_stream_to_one_sink(make):
    backend = Countdown(sends=True)
    scheduler = make(backend)
    sink = RecordingSink()
    assert await ask(scheduler, 3, sink=sink) == {}
    sent = sink.wait_final(5)
    assert [s.outputs["REMAINING"].tolist() for s in sent] == [[[2]], [[1]], [[0]]]
    assert [s.final for s in sent] == [False, False, True]


async def test_a_cancelled_request_is_not_run_again(make):
    backend = Countdown(delay=0.02)
    scheduler = make(backend)
    cancelled = threading.Event()
    task = asyncio.ensure_future(scheduler.submit({"STEPS": np.array([[100]], np.int32)}, ["REMAINING"], 1, {},
                                                  sink=RecordingSink(), cancelled=cancelled.is_set))
    await await_until(lambda: len(backend.batches) >= 2, what="the first steps run")
    cancelled.set()
    with pytest.raises(Exception, match="cancelled"):
        await task
    steps = sum(len(batch) for batch in backend.batches)
    assert steps < 20
    with pytest.raises(AssertionError, match="timed out"):  # for 0.1 s (real time) no step runs any more
        await await_until(lambda: sum(len(batch) for batch in backend.batches) != steps, timeout=0.1)
    assert scheduler.stats.sequences.active == 0


async def test_without_iterative_sequence_a_rescheduled_request_fails_with_tritons_words(make):
    scheduler = make(Countdown(), iterative=False)
    with pytest.raises(InvalidInput, match="^Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, "
                                           "while the model is not configured to handle such a flag"):
        await ask(scheduler, 2, {"sequence_id": 7, "sequence_start": True})
    with pytest.raises(InvalidInput, match="must specify a non-zero or non-empty correlation ID"):
        await ask(scheduler, 2)
