"""model.py sources and configs for the Python backend's end-to-end tests (pipelines, BLS, the pb_utils
surface), written as Triton users write them; ``bls_decoupled`` calls ``repeat`` of tests.models.decoupled."""

IDENTITY_CONFIG = """
name: "identity_fp32"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "IN_FP32" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT_FP32" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
"""

BLS_IO = """
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "ERR" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

# Calls the ONNX identity with exec(); a request whose first value is negative also calls a model that
# does not exist and returns the error text it got.
BLS_SYNC = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            call = pb_utils.InferenceRequest(
                model_name="identity_fp32", requested_output_names=["OUT_FP32"],
                inputs=[pb_utils.Tensor("IN_FP32", x)])
            response = call.exec()
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            y = pb_utils.get_output_tensor_by_name(response, "OUT_FP32").as_numpy() * 2
            err = b""
            if x[0, 0] < 0:
                missing = pb_utils.InferenceRequest(
                    model_name="nope", requested_output_names=["OUT_FP32"],
                    inputs=[pb_utils.Tensor("IN_FP32", x)]).exec()
                err = f"{missing.has_error()}|{missing.error().code()}|{missing.error().message()}".encode()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", y.astype(np.float32)),
                pb_utils.Tensor("ERR", np.array([[err]] * len(x), dtype=object))]))
        return responses
"""

# async def execute, two calls in flight at once.
BLS_ASYNC = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            calls = [pb_utils.InferenceRequest(model_name="identity_fp32", requested_output_names=["OUT_FP32"],
                                               inputs=[pb_utils.Tensor("IN_FP32", x * k)]) for k in (1, 10)]
            first, second = await asyncio.gather(*(c.async_exec() for c in calls))
            y = (pb_utils.get_output_tensor_by_name(first, "OUT_FP32").as_numpy()
                 + pb_utils.get_output_tensor_by_name(second, "OUT_FP32").as_numpy())
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", y), pb_utils.Tensor("ERR", np.array([[b""]] * len(x), dtype=object))]))
        return responses
"""

BLS_DECOUPLED_CONFIG = """
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# exec(decoupled=True) on ``repeat`` (tests.models.decoupled) and on the identity (a stream of one); async too.
BLS_DECOUPLED = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            total, count = 0, 0
            call = pb_utils.InferenceRequest(model_name="repeat", requested_output_names=["OUT"],
                                             inputs=[pb_utils.Tensor("IN", values)])
            for response in call.exec(decoupled=True):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                if response.output_tensors():
                    total += int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0])
                    count += 1
            for response in await call.async_exec(decoupled=True):
                if response.output_tensors():
                    count += 1
            single = pb_utils.InferenceRequest(
                model_name="identity_fp32", requested_output_names=["OUT_FP32"],
                inputs=[pb_utils.Tensor("IN_FP32", np.ones((1, 4), np.float32))]).exec(decoupled=True)
            count += 100 * len([r for r in single if r.output_tensors()])
            plain = pb_utils.InferenceRequest(model_name="repeat", requested_output_names=["OUT"],
                                              inputs=[pb_utils.Tensor("IN", values)]).exec()
            assert plain.has_error() and "decoupled=True" in plain.error().message(), plain.error()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", np.array([total], np.int32)),
                                                         pb_utils.Tensor("COUNT", np.array([count], np.int32))]))
        return responses
"""

SURFACE_CONFIG = """
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

# What a request carries, logs at every level, custom metrics, readiness and response parameters.
SURFACE = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]
        self.family = pb_utils.MetricFamily(name="surface_requests", description="Requests seen by surface",
                                            kind=pb_utils.MetricFamily.COUNTER)
        self.counter = self.family.Metric(labels={"model": "surface", "version": "1"})
        hist = pb_utils.MetricFamily(name="surface_values", description="First values",
                                     kind=pb_utils.MetricFamily.HISTOGRAM)
        self.hist = hist.Metric(labels={"model": "surface"}, buckets=[0.0, 1.0, 10.0])
        gauge = pb_utils.MetricFamily(name="surface_last", description="Last value", kind=pb_utils.MetricKind.GAUGE)
        self.gauge = gauge.Metric(labels={})

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            self.counter.increment(1)
            self.hist.observe(float(x[0]))
            self.gauge.set(float(x[0]))
            pb_utils.Logger.log_info("surface info line")
            pb_utils.Logger.log_warn("surface warn line")
            pb_utils.Logger.log_error("surface error line")
            pb_utils.Logger.log_verbose("surface verbose line")
            pb_utils.Logger.log("surface leveled line", pb_utils.Logger.LogLevel.WARNING)
            info = {
                "id": request.request_id(), "timeout": request.timeout(),
                "correlation_id": request.correlation_id(), "flags": request.flags(),
                "parameters": json.loads(request.parameters()), "instance": self.name,
                "counted": self.counter.value(), "ready": pb_utils.is_model_ready("identity_fp32"),
                "missing_ready": pb_utils.is_model_ready("nope"),
            }
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("INFO", np.array([json.dumps(info).encode()], dtype=object))],
                parameters={"seen": True, "first": int(x[0]), "note": "from surface"}))
        return responses
"""

ERRORS_CONFIG = """
backend: "python"
input [ { name: "CODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# Answers with TritonError(code) for the code it is sent; -1 raises (logged with its traceback).
ERRORS = """
import numpy as np
import triton_python_backend_utils as pb_utils


def _boom():
    raise ValueError("exploded on purpose")


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            code = int(pb_utils.get_input_tensor_by_name(request, "CODE").as_numpy()[0])
            if code < 0:
                _boom()
            responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"code {code}", code)))
        return responses
"""

DRIVER_CONFIG = """
backend: "python"
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]
"""

# No inputs at all (as Triton's qa bls models): it makes its own and calls the identity.
DRIVER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(model_name="identity_fp32", requested_output_names=["OUT_FP32"],
                                             inputs=[pb_utils.Tensor("IN_FP32", np.full((1, 4), 3, np.float32))])
            output = pb_utils.get_output_tensor_by_name(call.exec(), "OUT_FP32")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", output.as_numpy())]))
        return responses
"""
