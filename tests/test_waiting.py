"""tests/waiting.py: it returns as soon as the condition holds, and fails loudly when it never does."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from tests.waiting import await_until, next_turn, open_gate, wait_until


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


def test_next_turn_runs_what_is_ready_and_nothing_later():
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        ran: list[str] = []
        loop.call_soon(ran.append, "ready")
        loop.call_later(60, ran.append, "later")
        loop.call_soon(lambda: loop.call_soon(ran.append, "scheduled by what was ready"))
        await next_turn()
        first = list(ran)
        await next_turn(2)
        return [*first, "|", *ran]
    assert asyncio.run(main()) == ["ready", "|", "ready", "scheduled by what was ready"]


def test_open_gate_lets_the_one_waiting_go_on_and_fails_when_no_one_comes(tmp_path):
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    passed = threading.Event()
    waiting = threading.Thread(target=lambda: (open(gate).close(), passed.set()))
    waiting.start()
    assert not passed.wait(0.05)  # held at the gate
    open_gate(gate)
    waiting.join(10)
    assert passed.is_set()
    with pytest.raises(AssertionError, match="someone waiting at"):
        open_gate(gate, timeout=0.05)
