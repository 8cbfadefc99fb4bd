"""The daemon's side of a worker's link: a request's body that comes in the same read as its head still
reaches it; a request whose client went away is cancelled, even before it started; malformed messages,
requests and bodies end the link."""

from __future__ import annotations

import asyncio

from multidict import CIMultiDict

from appliance.protocol.operations import Operation
from appliance.rest.lane_wire import LaneHead
from appliance.workers.messages import ANSWER, BODY, CANCEL, REQUEST, head_fields
from appliance.workers.pool import WorkerPool, _Run


class _Lane:
    """Answers with the body it read (after ``delay``)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.cancelled = 0

    async def answer(self, head, body, peer, local, complete=False):
        data = await body()
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return [b"echo:" + data], complete


class _Link:
    def __init__(self) -> None:
        self.sent: list[tuple] = []
        self.closed = False

    def send(self, message: tuple) -> None:
        self.sent.append(message)

    def close(self) -> None:
        self.closed = True


_HEAD = head_fields(LaneHead(Operation.INFER, "POST", "/v2/models/m/infer", "m", None, CIMultiDict(), 4, False))


class _Process:
    returncode = None


def _pool(lane: _Lane) -> tuple[WorkerPool, _Run, _Link]:
    pool = WorkerPool(1, header_timeout=1, body_timeout=1, max_body=100, connection_limit=10, event_loop="asyncio")
    pool._lane = lane  # type: ignore[assignment]
    worker = _Run(1, _Process())  # type: ignore[arg-type]
    link = worker.link = _Link()  # type: ignore[assignment]
    return pool, worker, link  # type: ignore[return-value]


async def test_a_body_read_with_its_head_in_one_turn_reaches_the_request():
    pool, worker, link = _pool(_Lane())
    try:
        pool._on_message(worker, (REQUEST, 7, _HEAD, None, "127.0.0.1", "127.0.0.1"))
        pool._on_message(worker, (BODY, 7, b"data"))  # the same read of the link: before the request's task ran
        pool._on_message(worker, (REQUEST, 8, _HEAD, b"with", "127.0.0.1", "127.0.0.1"))
        await asyncio.wait_for(asyncio.gather(*worker.requests.values()), 5)
        assert sorted(link.sent) == [(ANSWER, 7, [b"echo:data"], False), (ANSWER, 8, [b"echo:with"], True)]
        assert worker.requests == {} and worker.bodies == {}
    finally:
        pool.page.close()


async def test_a_cancelled_request_is_cancelled_in_the_daemon_and_not_answered():
    lane = _Lane(delay=30)
    pool, worker, link = _pool(lane)
    try:
        pool._on_message(worker, (REQUEST, 1, _HEAD, b"xxxx", None, None))
        await asyncio.sleep(0.05)
        task = worker.requests[1]
        pool._on_message(worker, (CANCEL, 1))
        await asyncio.gather(task, return_exceptions=True)
        assert lane.cancelled == 1 and link.sent == [] and worker.requests == {}
    finally:
        pool.page.close()


async def test_a_malformed_request_ends_the_link():
    pool, worker, link = _pool(_Lane())
    try:
        pool._on_message(worker, (REQUEST, 1, ("model_load", "POST", "/", "m", None, [], 0, False), b"", None, None))
        await asyncio.gather(*worker.requests.values())
        assert link.closed and link.sent == []
    finally:
        pool.page.close()


async def test_a_request_cancelled_in_the_read_that_brought_it_leaves_nothing_behind():
    pool, worker, link = _pool(_Lane())
    try:
        pool._on_message(worker, (REQUEST, 3, _HEAD, None, None, None))  # its body still to come
        task = worker.requests[3]
        pool._on_message(worker, (CANCEL, 3))  # before its task ever ran
        await asyncio.gather(task, return_exceptions=True)
        assert worker.requests == {} and worker.bodies == {} and link.sent == []
    finally:
        pool.page.close()


async def test_messages_of_the_wrong_shape_end_the_link():
    for message in [(REQUEST, 1, _HEAD), (REQUEST, "1", _HEAD, b"", None, None), (BODY, 1, "text"), (99,), ()]:
        pool, worker, link = _pool(_Lane())
        try:
            pool._on_message(worker, message)
            assert link.closed and worker.requests == {}, message
        finally:
            pool.page.close()


async def test_a_body_longer_than_its_head_says_ends_the_link_unanswered():
    pool, worker, link = _pool(_Lane())
    try:
        pool._on_message(worker, (REQUEST, 1, _HEAD, b"eight by", None, None))  # the head says 4
        await asyncio.gather(*worker.requests.values(), return_exceptions=True)
        assert link.closed and link.sent == []
    finally:
        pool.page.close()
