"""Finding a backend: by name (plans, cached decisions) or by a model's config and files."""

from __future__ import annotations

import pytest

from appliance.backends import BACKENDS, named, resolve_backend
from appliance.core.errors import ConfigError


@pytest.mark.parametrize("info", BACKENDS, ids=lambda info: info.name)
def test_every_registered_backend_is_found_by_name(info):
    assert named(info.name) is info


def test_an_unknown_name_is_a_config_error_listing_the_known_ones():
    with pytest.raises(ConfigError, match="unknown backend 'tflite'; known: onnxruntime, openvino"):
        named("tflite")


def test_backend_resolution(tmp_path):
    assert resolve_backend("m", "", "onnxruntime_onnx", []).name == "onnxruntime"
    assert resolve_backend("m", "onnxruntime", "", []).name == "onnxruntime"
    assert resolve_backend("m", "", "torch_aoti", []).name == "torch_export"
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.onnx").write_bytes(b"")
    assert resolve_backend("m", "", "", [tmp_path / "1"]).name == "onnxruntime"
    with pytest.raises(ConfigError, match="cannot tell which backend"):
        resolve_backend("m", "", "", [tmp_path])
    with pytest.raises(ConfigError, match="unknown backend/platform 'caffe2'"):
        resolve_backend("m", "caffe2", "", [])
