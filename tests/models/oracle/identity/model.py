"""OUTPUT0 = INPUT0 (config.pbtxt labels its output with labels.txt, for classification;
unlabelled.pbtxt does not)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", tensor.as_numpy())]))
        return responses
