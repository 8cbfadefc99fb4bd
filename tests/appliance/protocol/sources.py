"""An inference request already decoded, handed to the data plane as a transport hands its wire form."""

from __future__ import annotations

from collections.abc import Callable

from appliance.engine.model import ModelVersion
from appliance.engine.tensor_checks import DecodeLimits
from appliance.engine.types import InferRequest
from appliance.protocol.admission import Caller
from appliance.protocol.inference import Target
from appliance.security.budget import Account

__all__ = ["LOCAL", "Decoded"]

LOCAL = Caller("127.0.0.1")


class Decoded:
    endpoint = "the test's end point"
    frontend = "HTTP"
    streaming_alternative = "a stream"

    def __init__(self, model: str, request: InferRequest, version: str | None = None, size: int = 0) -> None:
        self._target = Target(model, version)
        self._request = request
        self._size = size

    async def target(self, account: Account) -> Target:
        return self._target

    async def receive(self, account: Account) -> int:
        account.reserve(self._size)
        return self._size

    def decode(self, model: ModelVersion, limits: DecodeLimits, reserve: Callable[[int], None]) -> InferRequest:
        return self._request

    def traceparent(self) -> str | None:
        return None
