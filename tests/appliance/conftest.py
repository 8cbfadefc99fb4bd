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
