"""A Python-preprocessing -> ONNX-classifier ensemble shaped as the client repo's
ensemble_image_client.py expects: ``preprocess_inception_ensemble`` takes one BYTES input (an encoded
image per batch item, decoded by tests/models/ensemble/image_preprocess) and has one classification
output with labels.

Run as a script to write the repository somewhere (for running NVIDIA's client against a daemon):
``python -m tests.appliance.repository.ensemble.image_pipeline DIR [IMAGE_DIR]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from tests.appliance.repository.ensemble.repos import write_ensemble
from tests.builders import cnn_model, write_model
from tests.models import copy_model

LABELS = ["circle", "square", "stripe", "noise", "blank"]

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
    copy_model(repo, "ensemble/image_preprocess")
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
