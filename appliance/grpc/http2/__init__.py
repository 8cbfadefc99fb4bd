"""The appliance's own gRPC transport: HTTP/2 on an asyncio protocol, serving the same admitting handlers
as grpc.aio (``appliance.grpc.admission``) at a fraction of grpc.aio's cost per call (docs/performance.md)."""
