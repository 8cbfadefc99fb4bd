"""The auto-completed load context the loader hands the selector, for a model file and config text."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import LoadContext, RuntimeOptions, named
from appliance.repository.config import complete_config

ONNX = named("onnxruntime")


def onnx_context(model_file: Path, config_text: str = "") -> LoadContext:
    """``model_file`` lies at <repo>/<model>/1/model.onnx; the config is completed as the loader does."""
    name = model_file.parent.parent.name
    config = text_format.Parse(config_text, mc.ModelConfig())
    config.name = name
    backend = ONNX.load(LoadContext(name, 1, model_file, config, RuntimeOptions()))
    config = complete_config(config, platform="onnxruntime_onnx", backend="onnxruntime",
                             default_filename="model.onnx", inputs=backend.inputs(), outputs=backend.outputs())
    backend.close()
    return LoadContext(name, 1, model_file, config, RuntimeOptions(), threads=1)
