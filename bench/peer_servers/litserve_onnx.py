"""LitServe serving ONNX models: ``python litserve_onnx.py PORT MAX_BATCH MODEL.onnx...`` (each under the name of
its model directory, ``<name>/1/model.onnx``; MAX_BATCH 1: no batching, else up to MAX_BATCH requests
gathered for 1 ms). LitServe has no v2 endpoint of its own, so ``decode_request`` reads the v2 JSON body
(the first input's ``data``) and ``encode_response`` answers v2 JSON, on /v2/models/<name>/infer as the
others'. One inference worker a model, LitServe's default."""

from __future__ import annotations

import sys
from pathlib import Path

import litserve as ls
import numpy as np
import onnxruntime as ort


class OnnxAPI(ls.LitAPI):
    def __init__(self, model: str, max_batch: int) -> None:
        self._name = Path(model).parent.parent.name
        super().__init__(max_batch_size=max_batch, batch_timeout=0.001 if max_batch > 1 else 0.0,
                         api_path=f"/v2/models/{self._name}/infer")
        self._model = model

    def setup(self, device: str) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(self._model, options, providers=["CPUExecutionProvider"])
        self._input = self._session.get_inputs()[0].name
        self._outputs = [o.name for o in self._session.get_outputs()]

    def decode_request(self, request: dict) -> np.ndarray:
        tensor = request["inputs"][0]
        return np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])

    def batch(self, inputs: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(inputs)

    def predict(self, x: np.ndarray) -> list[np.ndarray]:
        return self._session.run(self._outputs, {self._input: x})

    def unbatch(self, outputs: list[np.ndarray]) -> list[list[np.ndarray]]:
        return [[output[i:i + 1] for output in outputs] for i in range(outputs[0].shape[0])]

    def encode_response(self, outputs: list[np.ndarray]) -> dict:
        return {"model_name": self._name, "outputs": [
            {"name": name, "datatype": "FP32", "shape": list(value.shape), "data": value.ravel().tolist()}
            for name, value in zip(self._outputs, outputs)]}


def main() -> None:
    port, max_batch, models = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    server = ls.LitServer([OnnxAPI(model, max_batch) for model in models], accelerator="cpu", devices=1,
                          workers_per_device=1, timeout=30)
    server.run(host="127.0.0.1", port=port, generate_client_file=False, log_level="warning")


if __name__ == "__main__":
    main()
