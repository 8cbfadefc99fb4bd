"""Fixtures for the suites that hold the appliance to real Triton: skipped, with the reason, where
Triton cannot be installed or started here."""

from __future__ import annotations

import pytest

from tests.oracle.install import TritonInstall, TritonUnavailable, install


@pytest.fixture(scope="session")
def triton_install() -> TritonInstall:
    """Real Triton installed into its cache (python -m tests.oracle install); skips when it cannot be."""
    try:
        return install()
    except TritonUnavailable as error:
        pytest.skip(f"real Triton unavailable: {error}")
