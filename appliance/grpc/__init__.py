"""The gRPC front end: Triton's ``inference.GRPCInferenceService`` (the messages and service generated in
``tritonclient.grpc``) over the data plane, beside the REST one and with the same rules: the appliance's
own HTTP/2 transport (``appliance.grpc.http2.server.Http2Server``) serves the admitting handlers
(``appliance.grpc.admission``); its configuration, free of grpc, is ``appliance.grpc.grpc_config``. grpcio
is a client library here (tritonclient, the tests), never the server."""
