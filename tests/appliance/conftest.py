"""Fixtures for behaviour tests: an appliance served inside the test process (tests/inprocess.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.inprocess import in_process_factory


@pytest.fixture
def serve_in_process(tmp_path_factory) -> Iterator:
    """Factory: serve_in_process(repository, **settings) -> InProcessServer; stopped after the test."""
    yield from in_process_factory(tmp_path_factory)


@pytest.fixture(scope="module")
def module_in_process(tmp_path_factory) -> Iterator:
    """The same factory, with servers shared by a test module."""
    yield from in_process_factory(tmp_path_factory)


@pytest.fixture
def awaited_requests(monkeypatch) -> list[str]:
    """The endpoints of the requests an in-process server serves on the data plane's awaited path
    (``Inference.infer``) from now on, in order: what the straight line did not take."""
    from appliance.protocol.inference import Inference

    awaited: list[str] = []
    original = Inference.infer

    def counted(self, caller, source, **kwargs):
        awaited.append(source.endpoint)
        return original(self, caller, source, **kwargs)

    monkeypatch.setattr(Inference, "infer", counted)
    return awaited
