"""Decodes each image with Pillow, scales it to 16x16 RGB in [0, 1], channels first."""

import io

import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image


def _pixels(encoded):
    image = Image.open(io.BytesIO(encoded)).convert("RGB").resize((16, 16))
    return np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / 255.0


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "RAW_IMAGE").as_numpy()
            try:
                batch = np.stack([_pixels(row[0]) for row in images])
            except Exception as exc:  # a file that is not an image: this request fails, not the batch
                error = pb_utils.TritonError(f"cannot decode the image: {exc}")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("PIXELS", batch)]))
        return responses
