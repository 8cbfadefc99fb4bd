"""A test-injected plan whose runs take the time its ``delay`` parameter says (seconds)."""

from __future__ import annotations

from appliance.backends import BackendInfo, LoadContext
from tests.fakes import FakeBackend

SLEEPY = BackendInfo(name="sleepy", platforms=("sleepy",), default_filename="model.onnx",
                     module="tests.appliance.selection.sleepy", factory="sleepy_backend", extra="cpu")


def sleepy_backend(context: LoadContext) -> FakeBackend:
    return FakeBackend(delay=float(context.parameter("delay") or 0))
