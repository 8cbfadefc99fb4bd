"""A BentoML service serving ONNX models: ``bentoml serve bentoml_onnx:OnnxService --host 127.0.0.1 --port PORT``
with ``BENCH_MODELS`` the model files, separated by ``:`` (each under the name of its model directory,
``<name>/1/model.onnx``). BentoML has no v2 endpoint of its own: each model gets an API on
/v2/models/<name>/infer that takes the v2 JSON body's ``inputs`` and answers v2 JSON. One worker, BentoML's
default; its adaptive batching takes arrays, not this body, so it is not tried."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import bentoml
import numpy as np
import onnxruntime as ort

_MODELS = {Path(path).parent.parent.name: path for path in os.environ.get("BENCH_MODELS", "").split(":") if path}


def _session(path: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


@bentoml.service(workers=1, logging={"access": {"enabled": False}})
class OnnxService:
    def __init__(self) -> None:
        self._sessions = {name: _session(path) for name, path in _MODELS.items()}

    def _infer(self, name: str, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        session = self._sessions[name]
        feed = {tensor["name"]: np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
                for tensor in inputs}
        names = [output.name for output in session.get_outputs()]
        results = session.run(names, feed)
        return {"model_name": name, "outputs": [
            {"name": output, "datatype": "FP32", "shape": list(value.shape), "data": value.ravel().tolist()}
            for output, value in zip(names, results)]}

    @bentoml.api(route="/v2/models/tiny/infer")
    def tiny(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        return self._infer("tiny", inputs)

    @bentoml.api(route="/v2/models/cnn_batched/infer")
    def cnn_batched(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        return self._infer("cnn_batched", inputs)
