"""Who may call: peers parsed from gRPC's peer strings, the request bound, the stop gate; errors mapped
to Triton's status codes."""

from __future__ import annotations

import grpc
import pytest

from appliance.access import parse_networks
from appliance.errors import (
    AlreadyExists,
    ConfigError,
    Forbidden,
    InferenceFailed,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    NotSupported,
    PayloadTooLarge,
    RegionNotFound,
    Unauthorized,
    Unavailable,
)
from appliance.grpc.access import Access, AccessRules, Gate, peer_address
from appliance.grpc.status import status_code


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


@pytest.mark.parametrize("protect", [False, True])
def test_token_rules(protect):
    gate = Gate(AccessRules(TOKEN, parse_networks(["127.0.0.1/32"]), protect_inference=protect))
    remote, local = "ipv4:10.0.0.5:4000", "ipv4:127.0.0.1:4000"
    gate.check_caller(_Context(local), Access.CONTROL)  # exempt
    gate.check_caller(_Context(remote), Access.OPEN)
    with pytest.raises(Unauthorized, match="'authorization: Bearer <token>' metadata"):
        gate.check_caller(_Context(remote), Access.CONTROL)
    with pytest.raises(Unauthorized):
        gate.check_caller(_Context(remote, (("authorization", "Bearer wrong"),)), Access.CONTROL)
    with pytest.raises(Unauthorized):
        gate.check_caller(_Context(remote, (("authorization", "Bearer "),)), Access.CONTROL)
    gate.check_caller(_Context(remote, (("authorization", f"Bearer {TOKEN}"),)), Access.CONTROL)
    if protect:
        with pytest.raises(Unauthorized):
            gate.check_caller(_Context(remote), Access.INFERENCE)
    else:
        gate.check_caller(_Context(remote), Access.INFERENCE)


async def test_request_bound_and_stop():
    gate = Gate(AccessRules(TOKEN, (), max_concurrent_requests=1))
    with gate.admit(Access.INFERENCE):
        assert gate.in_flight == 1
        with pytest.raises(Unavailable, match="max_concurrent_requests"), gate.admit(Access.INFERENCE):
            pass
        with gate.admit(Access.OPEN):  # health stays outside the bound
            pass
    assert gate.in_flight == 0
    gate.stop()
    with pytest.raises(Unavailable, match="stopping"), gate.admit(Access.OPEN):
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
])
def test_status_codes_are_tritons(error, code):
    assert status_code(error) is code
