"""Triton's dyna_sequence backend with string IDs: an accumulator per sequence that starts at the first
INPUT and adds the (numeric string) correlation ID at END."""

import functools

import numpy as np
import triton_python_backend_utils as pb_utils


def _value(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = functools.partial(_value, request)
            corrid = value("CORRID").reshape(-1)[0].decode()
            if not value("READY").any():
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.zeros((1, 1), np.int32))]))
                continue
            total = int(value("INPUT").sum()) + (0 if value("START").any() else self.sums.get(corrid, 0))
            self.sums[corrid] = total
            out = total + (int(corrid) if value("END").any() else 0)
            if value("END").any():
                self.sums.pop(corrid, None)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.full((1, 1), out, np.int32))]))
        return responses
