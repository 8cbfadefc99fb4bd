"""tests/waiting.py: it returns as soon as the condition holds, and fails loudly when it never does."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.waiting import await_until, wait_until


def test_wait_until_returns_the_first_truthy_value():
    calls = iter([0, None, "", "done", "later"])
    assert wait_until(lambda: next(calls), timeout=5) == "done"


def test_wait_until_fails_naming_what_it_waited_for():
    started = time.monotonic()
    with pytest.raises(AssertionError, match="waiting for the port .*last: False"):
        wait_until(lambda: False, timeout=0.05, what="the port")
    assert time.monotonic() - started < 2


def test_await_until_takes_async_predicates():
    async def main() -> str:
        values = iter([False, False, "up"])

        async def probe() -> object:
            return next(values)
        return await await_until(probe, timeout=5)
    assert asyncio.run(main()) == "up"
