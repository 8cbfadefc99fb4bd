"""The test network (conv 3->4, ReLU, global average pool, dense 4->3) in numpy, weights from .npy files
beside it; its tensors come from auto_complete_config(), so it needs no config.pbtxt."""

import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.add_input({"name": "image", "data_type": "TYPE_FP32", "dims": [3, 8, 8]})
        auto_complete_model_config.add_output({"name": "logits", "data_type": "TYPE_FP32", "dims": [3]})
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def initialize(self, args):
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.weights = {k: np.load(os.path.join(folder, k + ".npy")) for k in ("cw", "cb", "lw", "lb")}

    def execute(self, requests):
        w = self.weights
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "image").as_numpy()
            windows = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))
            conv = np.einsum("bchwij,ocij->bohw", windows, w["cw"]) + w["cb"][None, :, None, None]
            pooled = np.maximum(conv, 0).mean(axis=(2, 3))
            logits = pooled @ w["lw"].T + w["lb"]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("logits", logits.astype(np.float32))]))
        return responses
