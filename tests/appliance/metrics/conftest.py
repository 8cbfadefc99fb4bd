from __future__ import annotations

import pytest

from appliance.metrics.store import MetricsStore


@pytest.fixture
def make_store(tmp_path):
    """make_store(path=<tmp>/metrics.db, **kwargs) -> a MetricsStore, not started yet; every store is
    stopped after the test (its writer thread joined, its file closed), whatever the test got to."""
    stores: list[MetricsStore] = []

    def make(path=None, **kwargs) -> MetricsStore:
        stores.append(MetricsStore(path or tmp_path / "metrics.db", **kwargs))
        return stores[-1]

    yield make
    for store in stores:
        store.stop()
