"""Who may call: peers parsed from gRPC's peer strings, the request bound, the stop gate; errors mapped
to Triton's status codes."""

from __future__ import annotations

from unittest import mock

import grpc
import pytest

from appliance.core.errors import (
    AlreadyExists,
    ConfigError,
    Forbidden,
    InferenceFailed,
    InsufficientStorage,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    NotSupported,
    PayloadTooLarge,
    PushRefused,
    PushTooLarge,
    RegionNotFound,
    Unauthorized,
    Unavailable,
)
from appliance.grpc.access import Gate, caller_of, peer_address
from appliance.grpc.status import status_code
from appliance.protocol.admission import AccessPolicy, Admission, Caller
from appliance.protocol.dataplane import DataPlane
from appliance.protocol.operations import Operation
from appliance.repository.registry import ModelRegistry


@pytest.mark.parametrize("peer,address", [
    ("ipv4:127.0.0.2:51234", "127.0.0.2"),
    ("ipv6:[::1]:8001", "::1"),
    ("ipv6:%5B::1%5D:8001", "::1"),
    ("ipv6:[fe80::1%25eth0]:80", "fe80::1%eth0"),
    ("unix:/run/appliance.sock", None),
    ("", None),
])
def test_peer_address(peer, address):
    assert peer_address(peer) == address


class _Context:
    def __init__(self, peer: str, metadata: tuple = ()) -> None:
        self._peer, self._metadata = peer, metadata

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> tuple:
        return self._metadata


TOKEN = "a-token-of-at-least-16"


def test_the_caller_is_the_peer_with_its_authorization_metadata():
    caller = caller_of(_Context("ipv4:10.0.0.5:4000", (("x", "y"), ("authorization", f"Bearer {TOKEN}"))))
    assert caller.address == "10.0.0.5" and caller.authorization == f"Bearer {TOKEN}"
    assert "metadata" in caller.credentials and caller.browser_refusal is None  # browsers cannot speak gRPC
    assert caller_of(_Context("unix:/run/a.sock")).address is None


def _plane(limit: int = 1024) -> DataPlane:
    registry = mock.Mock(spec=ModelRegistry)
    return DataPlane(registry, admission=Admission(AccessPolicy(TOKEN), limit))


async def test_request_bound_streams_and_stop():
    gate = Gate(_plane(limit=2), max_streams=1)
    with gate.admit(Operation.INFER, Caller("127.0.0.1")):
        assert gate.in_flight == 1
        with gate.open_stream(Caller("127.0.0.1")):
            assert gate.streams == 1
            with pytest.raises(Unavailable, match="max_concurrent_requests"), gate.admit(Operation.INFER,
                                                                                          Caller("127.0.0.1")):
                pass
            with gate.admit(Operation.SERVER_LIVE, Caller("127.0.0.1")):  # health stays outside the bound
                pass
        with gate.open_stream(Caller("127.0.0.1")), pytest.raises(Unavailable, match="max_streams"), \
                gate.open_stream(Caller("127.0.0.1")):
            pass
    assert gate.in_flight == 0 and gate.streams == 0
    gate.stop()
    with pytest.raises(Unavailable, match="stopping"), gate.admit(Operation.SERVER_LIVE, Caller("127.0.0.1")):
        pass


@pytest.mark.parametrize("error,code", [
    (InvalidInput("x"), grpc.StatusCode.INVALID_ARGUMENT),
    (ConfigError("x"), grpc.StatusCode.INVALID_ARGUMENT),
    (ModelNotFound("x"), grpc.StatusCode.NOT_FOUND),
    (ModelNotReady("x"), grpc.StatusCode.UNAVAILABLE),
    (Unavailable("x"), grpc.StatusCode.UNAVAILABLE),
    (InferenceFailed("x"), grpc.StatusCode.INTERNAL),
    (NotSupported("x"), grpc.StatusCode.UNIMPLEMENTED),
    (Unauthorized("x"), grpc.StatusCode.UNAUTHENTICATED),
    (PayloadTooLarge("x"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (AlreadyExists("x"), grpc.StatusCode.ALREADY_EXISTS),
    (RegionNotFound("x"), grpc.StatusCode.NOT_FOUND),
    (Forbidden("x"), grpc.StatusCode.PERMISSION_DENIED),
    (PushRefused("x"), grpc.StatusCode.INTERNAL),
    (PushTooLarge("x"), grpc.StatusCode.INTERNAL),
    (InsufficientStorage("x"), grpc.StatusCode.RESOURCE_EXHAUSTED),
])
def test_status_codes_are_tritons(error, code):
    assert status_code(error) is code
