"""An MLServer custom runtime for an ONNX model (MLServer ships none): ``implementation`` in the model's
model-settings.json, ``parameters.uri`` the model file. Decoding and encoding are MLServer's own
(``NumpyCodec``), as its documentation's custom runtimes do."""

from __future__ import annotations

import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxModel(MLModel):
    async def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(self.settings.parameters.uri, options,
                                             providers=["CPUExecutionProvider"])
        self._inputs = [i.name for i in self._session.get_inputs()]
        self._outputs = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feed = {tensor.name: NumpyCodec.decode_input(tensor) for tensor in payload.inputs}
        results = self._session.run(self._outputs, feed)
        return InferenceResponse(model_name=self.name, id=payload.id,
                                 outputs=[NumpyCodec.encode_output(name, value)
                                          for name, value in zip(self._outputs, results)])
