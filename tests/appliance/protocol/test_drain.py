"""The one stop every front end keeps: requests in progress finish by the deadline, what is left is cut
(each front end's own way), counted and logged; nothing waits past the deadline and the grace."""

from __future__ import annotations

import asyncio
import logging
import time

from appliance.protocol.drain import CANCEL_GRACE, finish_by


async def test_requests_that_end_by_the_deadline_are_waited_for_and_not_cut(caplog):
    done = asyncio.Event()

    async def request() -> str:
        await done.wait()
        return "answered"

    task = asyncio.ensure_future(request())
    asyncio.get_running_loop().call_soon(done.set)
    assert await finish_by(time.monotonic() + 30, [task]) == 0
    assert task.result() == "answered"
    assert await finish_by(time.monotonic() - 1, []) == 0
    assert "shutdown deadline" not in caplog.text


async def test_requests_still_running_at_the_deadline_are_cut_counted_and_logged(caplog):
    cleaned: list[str] = []

    async def stuck(name: str) -> None:
        try:
            await asyncio.Event().wait()  # never set: only the stop ends it
        except asyncio.CancelledError:
            cleaned.append(name)  # a cut request still answers its cancellation (the grace)
            raise

    async def failing_when_cut() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("broke while being cut") from None

    quick = asyncio.ensure_future(asyncio.sleep(0))
    work = [asyncio.ensure_future(stuck("a")), asyncio.ensure_future(stuck("b")),
            asyncio.ensure_future(failing_when_cut()), quick]
    cut: list[asyncio.Future] = []

    def cancel(future: asyncio.Future) -> None:
        cut.append(future)
        future.cancel()

    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        assert await finish_by(started + 0.2, work, "gRPC request(s)", cancel=cancel) == 3
    took = time.monotonic() - started
    assert 0.15 <= took < 5 * (0.2 + CANCEL_GRACE)
    assert sorted(cleaned) == ["a", "b"] and quick not in cut and len(cut) == 3
    assert all(future.done() for future in work)
    assert "3 gRPC request(s) still running at the shutdown deadline: cancelled" in caplog.text


async def test_a_request_that_ignores_its_cancellation_holds_the_stop_no_longer_than_the_grace():
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue  # swallows every cancellation

    task = asyncio.ensure_future(stubborn())
    started = time.monotonic()
    assert await finish_by(started, [task]) == 1
    assert time.monotonic() - started < 5 * CANCEL_GRACE
    release.set()  # the test's own cleanup: the task ends
    await task
