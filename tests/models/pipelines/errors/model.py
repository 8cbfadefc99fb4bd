"""Answers with TritonError(code) for the code it is sent; -1 raises (logged with its traceback)."""

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
