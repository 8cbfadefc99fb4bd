"""/metrics counts the Python backend's arenas in /dev/shm by model (appliance_python_arena_bytes), and a
large request through the daemon leaves them within what is kept for reuse."""

from __future__ import annotations

import os
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

from appliance.backends.python.wire.arena import KEEP_BYTES
from tests.appliance.backends.python.test_arenas import ECHO, _shm_bytes
from tests.models import copy_model
from tests.processes import child_pids
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="arenas live in /dev/shm only on Linux")


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("arenas") / "repo"
    copy_model(root, ECHO, "echo")
    return root


def _gauge(daemon, model: str) -> float | None:
    text = urllib.request.urlopen(daemon.base + "/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(f'appliance_python_arena_bytes{{model="{model}"}} '):
            return float(line.rsplit(" ", 1)[1])
    return None


def _infer(client, values: np.ndarray) -> np.ndarray:
    tensor = httpclient.InferInput("IN", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    return client.infer("echo", [tensor]).as_numpy("OUT")


def test_arenas_are_counted_in_metrics_and_a_large_request_leaves_none_behind(daemon):
    with httpclient.InferenceServerClient(daemon.url, network_timeout=120) as client:
        assert _infer(client, np.full((20 << 20) // 4, 2.0, np.float32))[-1] == 2.0  # 20 MiB each way
        # 32 KiB: past what travels inline in the message (INLINE_BYTES), so through the arenas kept for reuse
        assert _infer(client, np.arange(8192, dtype=np.float32))[:4].tolist() == [0, 1, 2, 3]
    pids = {daemon.process.pid, *child_pids(daemon.process.pid)}

    def agreed() -> tuple[int] | None:  # the gauge is sampled each metrics tick
        held = _shm_bytes(pids)
        return (held,) if _gauge(daemon, "echo") == held else None

    (held,) = wait_until(agreed, timeout=30, interval=0.1, what="the arena gauge counting what /dev/shm holds")
    assert 0 < held < KEEP_BYTES  # the small request's arenas, not the large one's
