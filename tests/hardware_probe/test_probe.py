"""probe(): steps run side by side, bounded in time, and never take the probe down."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from hardware_probe import DEFAULT_STEPS, Step, probe


def _raise() -> dict:
    raise RuntimeError("driver said no")


def _import_missing() -> dict:
    import hardware_probe_no_such_module  # noqa: F401

    return {}


@pytest.fixture
def hanging_step() -> Iterator[Step]:
    """A step that hangs until the test ends, then lets its thread go."""
    release = threading.Event()

    def hang() -> dict:
        release.wait(60)
        return {"status": "present"}

    yield Step("hanging", hang)
    release.set()


def test_a_raising_and_a_hanging_step_are_absent_and_the_rest_is_reported(hanging_step: Step) -> None:
    steps = [*DEFAULT_STEPS, Step("faulty", _raise), Step("missing", _import_missing), hanging_step]
    started = time.monotonic()
    report = probe(timeout=0.5, steps=steps)
    elapsed = time.monotonic() - started

    assert elapsed < 3
    assert report.sections["faulty"] == {"status": "absent", "reason": "RuntimeError: driver said no"}
    assert report.sections["missing"]["status"] == "absent"
    assert "No module named 'hardware_probe_no_such_module'" in report.sections["missing"]["reason"]
    assert report.sections["hanging"] == {"status": "absent", "reason": "timed out after 0.5 s"}
    assert report.sections["cpu"]["status"] == "present"
    assert list(report.sections) == [step.name for step in steps]


def test_the_timeout_bounds_the_whole_probe_not_each_step_in_turn() -> None:
    release = threading.Event()
    steps = [Step(f"hang{i}", lambda: {"hung": release.wait(60)}) for i in range(10)]
    try:
        started = time.monotonic()
        report = probe(timeout=0.3, steps=steps)
        assert time.monotonic() - started < 1.5  # 5x the timeout; the steps in turn would take 3 s
    finally:
        release.set()
    assert all(section["status"] == "absent" for section in report.sections.values())


def test_a_step_that_returns_no_dict_is_absent_with_the_reason() -> None:
    report = probe(steps=[Step("odd", lambda: ["not", "a", "dict"])])
    assert report.sections["odd"]["status"] == "absent"
    assert "returned list, expected dict" in report.sections["odd"]["reason"]


def test_a_section_without_status_counts_as_present() -> None:
    report = probe(steps=[Step("plain", lambda: {"answer": 42})])
    assert report.sections["plain"] == {"status": "present", "answer": 42}


def test_progress_hears_of_each_step_as_it_ends_counting_up_to_all() -> None:
    heard: list[tuple[str, int, int]] = []
    steps = [Step("one", dict), Step("two", _raise), Step("three", lambda: {"x": 1})]
    probe(steps=steps, progress=lambda *args: heard.append(args))
    assert sorted(name for name, _, _ in heard) == ["one", "three", "two"]
    assert [(ended, total) for _, ended, total in heard] == [(1, 3), (2, 3), (3, 3)]


def test_a_progress_callback_that_raises_never_costs_the_report() -> None:
    def broken(name: str, ended: int, steps: int) -> None:
        raise OSError("stderr closed")

    report = probe(steps=[Step("plain", lambda: {"answer": 42})], progress=broken)
    assert report.sections["plain"] == {"status": "present", "answer": 42}


def test_duplicate_step_names_are_refused() -> None:
    with pytest.raises(ValueError, match="'cpu' appears twice"):
        probe(steps=[*DEFAULT_STEPS, Step("cpu", dict)])


@pytest.mark.parametrize("timeout", [0, -1.0])
def test_a_timeout_that_is_not_positive_is_refused(timeout: float) -> None:
    with pytest.raises(ValueError, match="positive number of seconds"):
        probe(timeout=timeout)


def test_importing_the_package_imports_no_runtime() -> None:
    # A fresh interpreter: this test process has long imported torch through other tests.
    code = (
        "import sys, hardware_probe\n"
        "loaded = {'torch', 'openvino', 'onnxruntime', 'onnx', 'tensorrt', 'pynvml'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
