"""A gRPC call's connection in memory, for tests that drive ``appliance.grpc.http2.call.Call`` without a
socket (message framing, inflation, receive slots)."""

from __future__ import annotations

import asyncio

from appliance.grpc.http2.call import Call

__all__ = ["MemoryChannel"]


class MemoryChannel:
    """What a Call needs of its connection (``appliance.grpc.http2.call.Channel``): what it writes goes
    nowhere, windows are ignored and every hold is granted. Make it on the running loop."""

    send_window = 1 << 20

    def __init__(self, max_message: int = 1 << 20, max_frame: int = 1 << 14) -> None:
        self.loop = asyncio.get_running_loop()
        self.peer = "ipv4:127.0.0.1:1"
        self.max_message = max_message
        self.max_frame = max_frame

    def write(self, data: bytes) -> None:
        pass

    async def drain(self) -> None:
        pass

    def wait_window(self, call: Call) -> None:
        pass

    def open_stream_window(self, stream: int, increment: int) -> None:
        pass

    def forget(self, call: Call) -> None:
        pass

    def hold(self, call: Call, size: int) -> bool:
        return True

    def release(self, size: int) -> None:
        pass
