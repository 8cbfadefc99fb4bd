"""A connection's surroundings for tests that drive ``Http2Connection`` by hand: a transport that records
what is sent, and a host serving an echoing RPC from a task (``/t.S/Echo``) and, where its message came
whole with its headers, without one (``/t.S/Fast``, a ``Straight`` handler as ModelInfer's)."""

from __future__ import annotations

import asyncio

import grpc

from appliance.grpc.admission import Straight
from appliance.grpc.grpc_config import GrpcConfig


class RecordingTransport:
    def __init__(self) -> None:
        self.sends: list[bytes] = []
        self.closing = False

    @property
    def written(self) -> bytes:
        return b"".join(self.sends)

    def write(self, data: bytes) -> None:
        self.sends.append(bytes(data))

    def close(self) -> None:
        self.closing = True

    abort = close

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 5) if name == "peername" else default


class EchoHost:
    """Serves /t.S/Echo (from a task) and /t.S/Fast (without one where it can); every other path is
    unknown."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.config = GrpcConfig(max_message_bytes=1 << 16, max_streams_per_connection=8, idle_timeout=60)

        async def echo(requests, context):
            return await context.read()

        self._echo = grpc.stream_unary_rpc_method_handler(echo, request_deserializer=None,
                                                          response_serializer=lambda raw: raw)
        self._fast = Straight(self._echo, _answer_at_once)

    def handler(self, path: bytes):
        return {b"/t.S/Echo": self._echo, b"/t.S/Fast": self._fast}.get(path)

    def opened(self, connection) -> None:
        pass

    def closed(self, connection) -> None:
        pass


def _answer_at_once(call) -> bool:
    message = call.take_message()
    call.serving(lambda: None)
    call.answer(message)
    call.ended()
    return True
