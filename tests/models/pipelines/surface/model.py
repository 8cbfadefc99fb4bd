"""What a request carries, logs at every level, custom metrics, readiness and response parameters."""

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
