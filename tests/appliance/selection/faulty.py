"""Test-injected plans: one that computes wrong numbers (every output shifted by 0.1), one that is slow."""

from __future__ import annotations

from appliance.backends import BackendInfo
from appliance.backends.onnxruntime import OnnxRuntimeBackend

FAULTY = BackendInfo(name="faulty", platforms=("faulty",), default_filename="model.onnx",
                     module="tests.appliance.selection.faulty", factory="ShiftedBackend", extra="cpu")


class ShiftedBackend(OnnxRuntimeBackend):
    def run(self, inputs, outputs):
        return {name: value + 0.1 for name, value in super().run(inputs, outputs).items()}


SLOWED = BackendInfo(name="slowed", platforms=("slowed",), default_filename="model.onnx",
                     module="tests.appliance.selection.faulty", factory="SlowedBackend", extra="cpu")
"""Right numbers, ten times the work: slower than the reference on any box."""


class SlowedBackend(OnnxRuntimeBackend):
    def run(self, inputs, outputs):
        for _ in range(9):
            super().run(inputs, outputs)
        return super().run(inputs, outputs)
