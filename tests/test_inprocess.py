"""The in-process server: serves on 127.0.0.1 ephemeral ports, and stops everything it started."""

from __future__ import annotations

import socket
import threading
import urllib.request

import pytest

from appliance.core.errors import ConfigError
from appliance.examples import build_example_repository
from tests.inprocess import in_process_factory


def test_serves_http_and_grpc_then_stops_in_reverse(tmp_path, tmp_path_factory):
    factory = in_process_factory(tmp_path_factory)
    serve = next(factory)
    server = serve(build_example_repository(tmp_path / "repo"))
    assert server.port and server.grpc_port and server.port != server.grpc_port
    with urllib.request.urlopen(server.base + "/v2/health/ready", timeout=10) as response:
        assert response.status == 200
    assert server.appliance is not None and server.appliance.registry.ready_count() == 3
    socket.create_connection(("127.0.0.1", server.grpc_port), timeout=5).close()
    with pytest.raises(StopIteration):
        next(factory)  # the factory's teardown
    assert server.appliance.registry.ready_count() == 0
    for port in (server.port, server.grpc_port):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)


def test_a_start_that_fails_stops_its_loop(tmp_path, tmp_path_factory):
    factory = in_process_factory(tmp_path_factory)
    serve = next(factory)
    with pytest.raises(ConfigError, match="does not exist"):
        serve(tmp_path / "missing")
    assert "in-process-server" not in [thread.name for thread in threading.enumerate()]
    server = serve(None, grpc=False)
    assert server.grpc_port is None
    with pytest.raises(AssertionError, match="serves no gRPC"):
        _ = server.grpc_url
    with pytest.raises(StopIteration):
        next(factory)
