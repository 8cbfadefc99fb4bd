"""The protocol's façade: the data plane every front end calls (REST and gRPC alike) and the protocol
extensions it owns — trace, logging and shared memory."""
