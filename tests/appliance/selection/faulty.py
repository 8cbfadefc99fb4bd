"""A test-injected plan that computes wrong numbers: onnxruntime with every output shifted by 0.1."""

from __future__ import annotations

from appliance.backends import BackendInfo
from appliance.backends.onnxruntime import OnnxRuntimeBackend

FAULTY = BackendInfo(name="faulty", platforms=("faulty",), default_filename="model.onnx",
                     module="tests.appliance.selection.faulty", factory="ShiftedBackend", extra="cpu")


class ShiftedBackend(OnnxRuntimeBackend):
    def run(self, inputs, outputs):
        return {name: value + 0.1 for name, value in super().run(inputs, outputs).items()}
