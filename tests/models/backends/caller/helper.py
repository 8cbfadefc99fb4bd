import triton_python_backend_utils as pb_utils


def ask_other(request):
    call = pb_utils.InferenceRequest(model_name="other", requested_output_names=["OUT"],
                                     inputs=[pb_utils.get_input_tensor_by_name(request, "IN")])
    answer = call.exec()
    if answer.has_error():
        raise pb_utils.TritonModelException(answer.error().message())
    return answer.output_tensors()[0].as_numpy()
