"""A model process the event loop reads is watched through a pidfd: ``alive`` asks no system call a
request (it called ``waitpid`` each time before), turns False once the process has exited, and the
pidfd is closed then, or by ``stop``."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from tests.appliance.backends.python.harness import loaded
from tests.models import copy_model, read_config
from tests.waiting import await_until

MODEL = "backends/slow_plus_one"
CONFIG = read_config(MODEL)

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="pidfd_open needs Linux 5.3 or later")


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def _never(*_args: object) -> None:
    raise AssertionError("alive asked for waitpid")


async def test_a_watched_process_is_alive_without_waitpid_and_dead_once_killed(tmp_path, monkeypatch):
    model = copy_model(tmp_path, MODEL, "slow")
    with loaded(model, CONFIG) as backend:
        process = backend._instance.process
        before = _descriptors()
        process.read_on(asyncio.get_running_loop())
        assert _descriptors() == before + 1  # the pidfd
        monkeypatch.setattr(process.process, "poll", _never)
        for _ in range(3):
            assert process.alive
        monkeypatch.undo()
        os.kill(process.pid, signal.SIGKILL)
        await await_until(lambda: not process.alive, what="the loop to see the process exit")
        await await_until(lambda: _descriptors() == before, what="the pidfd to close")


async def test_stop_closes_the_pidfd_of_a_process_that_finalized(tmp_path):
    model = copy_model(tmp_path, MODEL, "slow")
    before = _descriptors()
    with loaded(model, CONFIG) as backend:
        backend._instance.process.read_on(asyncio.get_running_loop())
        await asyncio.sleep(0.1)
    # loaded() stopped the process from the loop's thread: the pidfd was closed there.
    await await_until(lambda: _descriptors() <= before, what="the model's descriptors to close")
