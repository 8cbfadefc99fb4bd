"""gRPC's straight line leaves no garbage cycles: every object a ModelInfer call made is freed by its last
reference, not left for the cyclic garbage collector, whose passes cost each request (as the HTTP lane's,
tests/appliance/rest/test_lane_garbage_e2e.py); a model's call and an ensemble's."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.appliance.repository.ensemble.repos import chain_repository
from tests.garbage import appliance_cycles
from tests.models import copy_model


def _echo(client: grpcclient.InferenceServerClient) -> None:
    tensor = grpcclient.InferInput("IN", [4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
    client.infer("arena_echo", [tensor])


def _chain(client: grpcclient.InferenceServerClient) -> None:
    tensor = grpcclient.InferInput("IN", [1, 8], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 8), np.float32))
    client.infer("chain", [tensor])


@pytest.mark.parametrize("call", [_echo, _chain], ids=["model", "ensemble"])
def test_a_call_frees_what_it_made_without_the_collector(serve_in_process, tmp_path, call):
    copy_model(tmp_path, "backends/arena_echo")
    chain_repository(tmp_path)
    server = serve_in_process(tmp_path)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        for _ in range(20):  # warm: first calls make what is kept
            call(client)
        with appliance_cycles() as ours:
            for _ in range(50):
                call(client)
    finally:
        client.close()
    assert not ours, f"calls left cycles of the daemon's objects: {dict(ours)}"
