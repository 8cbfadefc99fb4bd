"""KServe's Python model server serving ONNX models: ``python kserve_onnx.py HTTP_PORT GRPC_PORT MODEL.onnx...``
(each served under the name of its model directory, ``<name>/1/model.onnx``).
The v2 protocol (REST and gRPC) is KServe's own; latency logging, which it turns on by default, is off
and so are its access and trace lines (a tuned box would not log a line a request)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer


class OnnxModel(Model):
    def __init__(self, name: str, path: str) -> None:
        super().__init__(name)
        self._path = path
        self.load()

    def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(self._path, options, providers=["CPUExecutionProvider"])
        self._outputs = [o.name for o in self._session.get_outputs()]
        self.ready = True
        return self.ready

    def predict(self, payload: InferRequest, headers: dict | None = None) -> InferResponse:
        feed = {tensor.name: tensor.as_numpy() for tensor in payload.inputs}
        results = self._session.run(self._outputs, feed)
        outputs = []
        for name, value in zip(self._outputs, results):
            output = InferOutput(name=name, shape=list(value.shape), datatype="FP32")
            output.set_data_from_numpy(value, binary_data=payload.from_grpc)  # gRPC: raw_output_contents
            outputs.append(output)
        return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=outputs,
                             from_grpc=payload.from_grpc)


def _loopback_only() -> None:
    """KServe binds every address (0.0.0.0 for REST, [::] for gRPC) with no option to choose: benchmarks
    here bind 127.0.0.1 only, so its two bind calls are narrowed before it makes them."""
    import grpc.aio
    import uvicorn

    config_init = uvicorn.Config.__init__

    def loopback_config(self: uvicorn.Config, app: object, **kwargs: object) -> None:
        config_init(self, app, **{**kwargs, "host": "127.0.0.1"})

    uvicorn.Config.__init__ = loopback_config  # type: ignore[method-assign]
    grpc_server = grpc.aio.server

    def loopback_server(*args: object, **kwargs: object) -> grpc.aio.Server:
        server = grpc_server(*args, **kwargs)
        add_port = server.add_insecure_port
        server.add_insecure_port = lambda address: add_port(address.replace("[::]", "127.0.0.1"))  # type: ignore[method-assign]
        return server

    grpc.aio.server = loopback_server  # type: ignore[assignment]


def main() -> None:
    _loopback_only()
    http_port, grpc_port, models = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    server = ModelServer(http_port=http_port, grpc_port=grpc_port, workers=1, enable_latency_logging=False)
    for quiet in ("kserve", "kserve.trace", "uvicorn.access"):  # a line a request otherwise
        logging.getLogger(quiet).setLevel(logging.WARNING)
    server.start([OnnxModel(Path(model).parent.parent.name, model) for model in models])


if __name__ == "__main__":
    main()
