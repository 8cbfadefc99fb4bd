"""The appliance's own gRPC transport: HTTP/2 on an asyncio protocol, serving the admitting handlers
(``appliance.grpc.admission``) at a fraction of grpc.aio's cost per call (docs/performance.md; grpc.aio,
the server it replaced, was removed)."""
