"""The addresses of a served appliance as the tests' clients want them, shared by the subprocess daemons
(tests/conftest.py: Daemon) and the servers run in the test process (tests/inprocess.py: InProcessServer)."""

from __future__ import annotations

__all__ = ["Addresses"]


class Addresses:
    """url, grpc_url and base from the ``port`` and ``grpc_port`` a subclass holds (127.0.0.1 both)."""

    port: int
    grpc_port: int | None

    @property
    def url(self) -> str:
        """host:port as tritonclient wants it."""
        return f"127.0.0.1:{self.port}"

    @property
    def grpc_url(self) -> str:
        """host:port as tritonclient.grpc wants it."""
        assert self.grpc_port is not None, f"this {type(self).__name__} serves no gRPC"
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def base(self) -> str:
        """The HTTP base URL, for urllib and raw requests."""
        return f"http://127.0.0.1:{self.port}"
