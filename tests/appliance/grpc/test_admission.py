"""The map of the gRPC admission's RPCs to data-plane operations covers the whole service (its receive
slots are tested in test_receive.py)."""

from __future__ import annotations

from tritonclient.grpc import service_pb2 as pb

from appliance.grpc.admission import OPERATIONS


def test_every_rpc_of_the_service_names_its_operation():
    assert set(OPERATIONS) == set(pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name)
