"""The lifecycle every server of the daemon implements — the HTTP port (aiohttp and the infer lane), the
metrics port, and the gRPC port — so that the daemon starts and stops them alike (each stop waits for its
requests, and cuts them, with ``appliance.protocol.drain.finish_by``)."""

from __future__ import annotations

from typing import Protocol

__all__ = ["FrontEnd"]


class FrontEnd(Protocol):
    @property
    def port(self) -> int | None:
        """The bound port once started (None before)."""
        ...

    async def start(self, host: str, port: int) -> int:
        """Bind ``host:port`` (0 picks a free port), start serving, and return the bound port."""
        ...

    async def stop(self, deadline: float) -> None:
        """Stop accepting; requests in progress have until ``deadline`` (``time.monotonic()``); then what is
        left is cancelled and every connection closed."""
        ...
