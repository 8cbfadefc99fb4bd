"""model.py sources for the Python backend tests, written as Triton's own examples are."""

ADD_SUB = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

    def execute(self, requests):
        output0_dtype = self.output0_dtype
        output1_dtype = self.output1_dtype
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            out_0, out_1 = (in_0.as_numpy() + in_1.as_numpy(), in_0.as_numpy() - in_1.as_numpy())
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(output1_dtype))
            inference_response = pb_utils.InferenceResponse(output_tensors=[out_tensor_0, out_tensor_1])
            responses.append(inference_response)
        return responses

    def finalize(self):
        print("Cleaning up...")
'''

ADD_SUB_CONFIG = '''
name: "add_sub"
backend: "python"
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
instance_group [ { kind: KIND_CPU } ]
'''

# The test network (conv 3->4, ReLU, global average pool, dense 4->3) in numpy, weights from .npy files;
# its tensors come from auto_complete_config(), so it needs no config.pbtxt.
NUMPY_CNN = '''
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
'''

_SIMPLE_IO = '''
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]
'''
SIMPLE_CONFIG = 'backend: "python"\n' + _SIMPLE_IO

RAISES = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        raise pb_utils.TritonModelException("this model always fails")
'''

WRONG_COUNT = '''
class TritonPythonModel:
    def execute(self, requests):
        return []
'''

EXITS = '''
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            if x[0, 0] < 0:
                os._exit(3)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x * 2)]))
        return responses
'''

REQUEST_ERROR = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        error = pb_utils.TritonError("x must be positive", pb_utils.TritonError.INVALID_ARG)
        return [pb_utils.InferenceResponse(error=error) for _ in requests]
'''

SLEEPY = '''
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            pb_utils.Logger.log_info(f"sleepy: sleeping {float(x.ravel()[0]):g} s")
            time.sleep(float(x.ravel()[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x)]))
        return responses
'''
"""Sleeps x[0] seconds, then echoes x (serve it with SIMPLE_CONFIG): a request that takes as long as asked. It
logs "sleepy: sleeping <x[0]> s" (the daemon's log) as it starts: the request is running in the model."""
