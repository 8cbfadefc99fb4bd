"""A Python-preprocessing -> ONNX-classifier ensemble shaped as the client repo's
ensemble_image_client.py expects: ``preprocess_inception_ensemble`` takes one BYTES input (an encoded
image per batch item) and has one classification output with labels.

Run as a script to write the repository somewhere (for running NVIDIA's client against a daemon):
``python -m tests.appliance.repository.ensemble.image_pipeline DIR [IMAGE_DIR]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from tests.appliance.repository.ensemble.repos import write_ensemble
from tests.builders import cnn_model, write_model
from tests.models import write_python_model

LABELS = ["circle", "square", "stripe", "noise", "blank"]

# Decodes each image with Pillow, scales it to 16x16 RGB in [0, 1], channels first.
PREPROCESS = '''
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
'''

PREPROCESS_CONFIG = '''
backend: "python"
max_batch_size: 8
input [ { name: "RAW_IMAGE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "PIXELS" data_type: TYPE_FP32 dims: [ 3, 16, 16 ] } ]
'''

CLASSIFIER_CONFIG = '''
platform: "onnxruntime_onnx"
max_batch_size: 8
dynamic_batching { }
'''

ENSEMBLE_CONFIG = '''
name: "preprocess_inception_ensemble"
platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 5 ] label_filename: "labels.txt" } ]
ensemble_scheduling {
  step [
    {
      model_name: "image_preprocess"
      model_version: -1
      input_map { key: "RAW_IMAGE" value: "INPUT" }
      output_map { key: "PIXELS" value: "preprocessed_image" }
    },
    {
      model_name: "classifier"
      model_version: -1
      input_map { key: "image" value: "preprocessed_image" }
      output_map { key: "logits" value: "OUTPUT" }
    }
  ]
}
'''


def image_pipeline_repository(repo: Path) -> Path:
    write_python_model(repo, "image_preprocess", PREPROCESS, PREPROCESS_CONFIG)
    write_model(repo, "classifier", cnn_model(), config=CLASSIFIER_CONFIG)
    ensemble = write_ensemble(repo, "preprocess_inception_ensemble", ENSEMBLE_CONFIG)
    (ensemble / "labels.txt").write_text("\n".join(LABELS) + "\n")
    return repo


def write_images(folder: Path) -> list[Path]:
    """Three small PNG files (a gradient, a checkerboard, a flat colour)."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    y, x = np.mgrid[0:40, 0:48]
    arrays = {
        "gradient.png": np.stack([x * 5, y * 6, (x + y) * 3], axis=-1),
        "checker.png": np.repeat((((x // 8) + (y // 8)) % 2 * 255)[..., None], 3, axis=-1),
        "flat.png": np.full((40, 48, 3), (200, 30, 90)),
    }
    paths = []
    for name, array in arrays.items():
        Image.fromarray(array.astype(np.uint8)).save(folder / name)
        paths.append(folder / name)
    return paths


if __name__ == "__main__":
    image_pipeline_repository(Path(sys.argv[1]))
    if len(sys.argv) > 2:
        write_images(Path(sys.argv[2]))
