"""The gRPC front end: Triton's ``inference.GRPCInferenceService`` (the messages and service generated in
``tritonclient.grpc``) over the data plane, beside the REST one and with the same rules
(``appliance.grpc.grpc_server.GrpcServer``; its configuration, free of grpc, in ``appliance.grpc.config``)."""
