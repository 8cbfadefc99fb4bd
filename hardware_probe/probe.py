"""Run probe steps side by side, each in its own daemon thread and each bounded in time."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from hardware_probe.report import ProbeReport
from hardware_probe.step import Step, absent
from hardware_probe.steps import DEFAULT_STEPS

__all__ = ["DEFAULT_TIMEOUT", "Progress", "probe"]

_log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 60.0
"""Seconds each step may take, for every caller that keys something on the fingerprint (the daemon, ``appliance
probe``, ``appliance tune``). A step cut off reads as absent and changes the fingerprint that keys the model
cache (a miss, and tuning again; a decision ``tune`` caches that the daemon never reads), so the bound is one a
cold start of every runtime fits in on a loaded box; only a step that hangs costs it in full."""

Progress = Callable[[str, int, int], None]
"""progress(step name, steps ended, steps): called from the step's thread as each step ends."""


class _Attempt:
    """One step running in a daemon thread.

    Daemon threads, not a ThreadPoolExecutor: the executor's workers are joined at interpreter exit,
    so one step stuck in a driver call would keep the whole process from exiting.
    """

    def __init__(self, step: Step, ended: Callable[[str], None]) -> None:
        self.step = step
        self.section: dict | None = None
        self._ended = ended
        self.thread = threading.Thread(target=self._run, name=f"hardware-probe-{step.name}", daemon=True)

    def _run(self) -> None:
        try:
            section = self.step.run()
            if not isinstance(section, dict):
                raise TypeError(f"step {self.step.name!r} returned {type(section).__name__}, expected dict")
            self.section = {"status": "present", **section}
        except BaseException as exc:  # a step must never take the probe down, whatever it raises
            self.section = absent(_describe_error(exc))
            _log.warning("hardware probe step %r failed: %s", self.step.name, self.section["reason"])
        self._ended(self.step.name)


class _Tally:
    """Counts the steps that ended and tells ``progress`` (thread-safe; a progress callback that raises is
    logged, never the probe's end)."""

    def __init__(self, steps: int, progress: Progress | None) -> None:
        self._steps, self._progress, self._ended = steps, progress, 0
        self._lock = threading.Lock()

    def __call__(self, name: str) -> None:
        if self._progress is None:
            return
        with self._lock:
            self._ended += 1
            try:
                self._progress(name, self._ended, self._steps)
            except Exception as exc:  # noqa: BLE001 - progress is a courtesy
                _log.warning("hardware probe progress callback failed: %s", _describe_error(exc))


def _describe_error(exc: BaseException) -> str:
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _check_steps(steps: Sequence[Step]) -> None:
    seen: set[str] = set()
    for step in steps:
        if step.name in seen:
            raise ValueError(f"probe step names must be unique; {step.name!r} appears twice")
        seen.add(step.name)


def probe(timeout: float = DEFAULT_TIMEOUT, steps: Sequence[Step] | None = None,
          progress: Progress | None = None) -> ProbeReport:
    """Probe this box. Every step runs concurrently and is waited on at most `timeout` seconds.

    A step that raises or outlives the timeout becomes {"status": "absent", "reason": ...}; a step
    that hangs is left behind in its daemon thread, so probe() returns after about `timeout` seconds
    at worst. `steps=None` runs DEFAULT_STEPS. `progress` hears of each step as it ends.
    """
    if timeout <= 0:
        raise ValueError(f"probe timeout must be a positive number of seconds, got {timeout!r}")
    if steps is None:
        steps = DEFAULT_STEPS
    _check_steps(steps)

    tally = _Tally(len(steps), progress)
    attempts = [_Attempt(step, tally) for step in steps]
    # All steps start together, so one deadline bounds each step and the whole probe alike.
    deadline = time.monotonic() + timeout
    for attempt in attempts:
        attempt.thread.start()

    sections: dict[str, dict] = {}
    for attempt in attempts:
        attempt.thread.join(max(0.0, deadline - time.monotonic()))
        if attempt.thread.is_alive():
            sections[attempt.step.name] = absent(f"timed out after {timeout} s")
            _log.warning("hardware probe step %r timed out after %s s", attempt.step.name, timeout)
        else:
            sections[attempt.step.name] = attempt.section or absent("step ended without a section")
    return ProbeReport(sections)
