"""The gRPC front end: Triton's ``inference.GRPCInferenceService`` (the messages and service generated in
``tritonclient.grpc``) over the data plane, beside the REST one and with the same rules. Two transports
serve the same admitting handlers (``appliance.grpc.admission``): the appliance's own HTTP/2
(``appliance.grpc.http2.server.Http2Server``, the default) and grpc.aio
(``appliance.grpc.grpc_server.GrpcServer``); their configuration, free of grpc, is ``appliance.grpc.grpc_config``."""
