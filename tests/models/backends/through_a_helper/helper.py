import triton_python_backend_utils as pb_utils


def ask_other(request):
    call = pb_utils.InferenceRequest(model_name="other", requested_output_names=["OUT"],
                                     inputs=[pb_utils.get_input_tensor_by_name(request, "IN")])
    return call.exec().output_tensors()[0].as_numpy()
