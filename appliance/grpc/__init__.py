"""The gRPC front end: Triton's ``inference.GRPCInferenceService`` (the messages and service generated in
``tritonclient.grpc``) over a started ``Appliance``, beside the REST one and with the same rules."""

from appliance.grpc.grpc_server import GrpcServer

__all__ = ["GrpcServer"]
