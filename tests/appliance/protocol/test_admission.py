"""Who may call what, for every transport: the one operation table, the token rules, the browser rules
and the bound on requests in flight."""

from __future__ import annotations

import pytest

from appliance.core.errors import Forbidden, Unauthorized, Unavailable
from appliance.protocol.admission import AccessPolicy, Admission, Caller, parse_networks
from appliance.protocol.operations import ACCESS, BOUNDLESS, Access, Operation
from appliance.security.fleet_signature import FleetVerifier, body_digest, sign

TOKEN = "a-token-of-at-least-16"
REMOTE, LOCAL = "10.0.0.5", "127.0.0.1"


def test_every_operation_has_one_access_level_and_the_control_ones_change_the_server():
    assert set(ACCESS) == set(Operation)
    control = {op for op, level in ACCESS.items() if level is Access.CONTROL}
    assert control == {Operation.MODEL_LOAD, Operation.MODEL_UNLOAD, Operation.SHM_REGISTER,
                       Operation.SHM_UNREGISTER, Operation.TRACE_UPDATE, Operation.LOG_UPDATE}
    assert {op for op, level in ACCESS.items() if level is Access.OPEN} == {
        Operation.SERVER_LIVE, Operation.SERVER_READY, Operation.SERVER_HEALTH, Operation.FLEET_NONCE}
    assert {Operation.SERVER_LIVE, Operation.SERVER_READY, Operation.SERVER_HEALTH, Operation.METRICS} == BOUNDLESS


@pytest.mark.parametrize("protect", [False, True])
def test_token_rules(protect):
    policy = AccessPolicy(TOKEN, parse_networks(["127.0.0.1/32"]), protect_inference=protect)
    policy.check(Operation.MODEL_LOAD, Caller(LOCAL))  # exempt
    policy.check(Operation.SERVER_LIVE, Caller(REMOTE))
    with pytest.raises(Unauthorized, match="'Authorization: Bearer <token>'"):
        policy.check(Operation.MODEL_LOAD, Caller(REMOTE))
    with pytest.raises(Unauthorized, match="'authorization: Bearer <token>' metadata"):
        policy.check(Operation.MODEL_LOAD, Caller(REMOTE, credentials="'authorization: Bearer <token>' metadata"))
    for wrong in ("Bearer wrong", "Bearer ", "Basic " + TOKEN, TOKEN):
        with pytest.raises(Unauthorized):
            policy.check(Operation.LOG_UPDATE, Caller(REMOTE, wrong))
    policy.check(Operation.MODEL_LOAD, Caller(REMOTE, f"Bearer {TOKEN}"))
    if protect:
        with pytest.raises(Unauthorized):
            policy.check(Operation.INFER, Caller(REMOTE))
        policy.check(Operation.INFER, Caller(LOCAL))
    else:
        policy.check(Operation.INFER, Caller(REMOTE))
    policy.check(Operation.SERVER_HEALTH, Caller(None))  # a UNIX socket peer is never exempt, health is open


def test_a_signed_request_proves_the_token_where_the_transport_gives_its_request_line():
    box = FleetVerifier(TOKEN, "8d5a3c1e-1111-4222-8333-944445555666")
    policy = AccessPolicy(TOKEN, parse_networks(["127.0.0.1/32"]), signatures=box)
    body = b'{"parameters": {}}'
    signed = sign(TOKEN, box.box_id, box.nonce(), "POST", "/v2/repository/models/m/load", body)
    line = ("POST", "/v2/repository/models/m/load")
    assert policy.check(Operation.MODEL_LOAD, Caller(REMOTE, signed, request_line=line)) == body_digest(body)
    with pytest.raises(Unauthorized, match="used already"):
        policy.check(Operation.MODEL_LOAD, Caller(REMOTE, signed, request_line=line))
    fresh = sign(TOKEN, box.box_id, box.nonce(), "POST", "/v2/repository/models/m/load", body)
    with pytest.raises(Unauthorized, match="Bearer"):  # gRPC gives no request line: the bearer token only
        policy.check(Operation.MODEL_LOAD, Caller(REMOTE, fresh))
    assert policy.check(Operation.MODEL_LOAD, Caller(LOCAL, fresh, request_line=line)) is None  # exempt
    with pytest.raises(Unauthorized):  # a policy without signatures takes none
        AccessPolicy(TOKEN).check(Operation.MODEL_LOAD, Caller(REMOTE, fresh, request_line=line))


def test_browser_rules_guard_control_even_with_the_token_and_from_an_exempt_address():
    policy = AccessPolicy(TOKEN, parse_networks(["127.0.0.0/8"]))
    page = Caller(LOCAL, f"Bearer {TOKEN}", browser_refusal=Forbidden("another site"))
    with pytest.raises(Forbidden):
        policy.check(Operation.SHM_REGISTER, page)
    policy.check(Operation.INFER, page)  # inference: the data plane applies them only to shared memory


def test_the_bound_on_requests_in_flight_leaves_health_and_metrics_out():
    admission = Admission(AccessPolicy(TOKEN), max_concurrent_requests=1)
    with admission.admit(Operation.INFER, Caller(LOCAL)):
        assert admission.in_flight == 1
        with pytest.raises(Unavailable, match="max_concurrent_requests"), admission.admit(Operation.MODEL_METADATA,
                                                                                           Caller(LOCAL)):
            pass
        for operation in BOUNDLESS:
            with admission.admit(operation, Caller(LOCAL)):
                pass
    assert admission.in_flight == 0
    with pytest.raises(Unauthorized), admission.admit(Operation.MODEL_LOAD, Caller(REMOTE)):
        pass
    assert admission.in_flight == 0


def test_a_proof_skips_the_access_check_of_the_same_caller_but_not_the_bound():
    """A connection that sends the same head again shows the proof its first request earned: the check
    stands, the bound on requests at once is counted as ever; a refusal and a signed request earn none."""
    admission = Admission(AccessPolicy(TOKEN, protect_inference=True), max_concurrent_requests=1)
    caller = Caller(REMOTE, f"Bearer {TOKEN}")
    first = admission.admit(Operation.INFER, caller)
    with first:
        assert first.proof is admission.policy and admission.in_flight == 1
    again = admission.admit(Operation.INFER, Caller(REMOTE, "Bearer wrong"), first.proof)
    # (the proof stands for the head it came with: the lane shows it for that head alone)
    with again, pytest.raises(Unavailable, match="max_concurrent_requests"), admission.admit(
            Operation.INFER, caller, first.proof):
        pass
    refused = admission.admit(Operation.INFER, Caller(REMOTE, "Bearer wrong"))
    with pytest.raises(Unauthorized), refused:
        pass
    assert refused.proof is None and admission.in_flight == 0
    assert admission.admit(Operation.INFER, caller, AccessPolicy(TOKEN)).__enter__() is None  # another policy's
    box = FleetVerifier(TOKEN, "8d5a3c1e-1111-4222-8333-944445555666")
    signing = Admission(AccessPolicy(TOKEN, signatures=box))
    line = ("POST", "/v2/repository/models/m/load")
    signed = signing.admit(Operation.MODEL_LOAD, Caller(REMOTE, sign(TOKEN, box.box_id, box.nonce(), *line, b""),
                                                          request_line=line))
    with signed:
        assert signed.proof is None  # its nonce is spent: the next request signs afresh


def test_junk_addresses_lie_in_no_network_and_are_not_kept():
    """A forwarded header may carry anything: junk lies in no network, and what is longer than any IP
    literal is refused before the parse cache holds it (the cache keeps only short literals)."""
    from appliance.protocol.admission import _parsed, address_in

    networks = parse_networks(["10.0.0.0/8", "fe80::/10"])
    _parsed.cache_clear()
    assert address_in("10.1.2.3", networks) and address_in("fe80::1%eth0", networks)
    assert not address_in("10.1.2.3" + "0" * 8000, networks)
    assert not address_in("not an address", networks) and not address_in("", networks)
    assert not address_in("10.1.2.3", ())
    assert _parsed.cache_info().currsize == 3  # the two literals and the short junk, not the 8 KiB one
