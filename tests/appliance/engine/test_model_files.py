"""Files a config names stay inside the model's directory and are read with a bound."""

from __future__ import annotations

import os
import threading

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from appliance.core.errors import ConfigError
from appliance.engine.model_files import check_config_paths, confined, read_bounded


@pytest.fixture
def model_dir(tmp_path):
    path = tmp_path / "repo" / "m"
    (path / "1").mkdir(parents=True)
    (path / "labels.txt").write_text("a\nb\n")
    (tmp_path / "secret").write_text("s")
    return path


@pytest.mark.parametrize("name", ["../../secret", "/etc/passwd", "1/../../../secret", ".", "", "a\0b"])
def test_names_that_leave_the_model_are_refused(model_dir, name):
    with pytest.raises(ConfigError, match="label_filename"):
        confined(model_dir, name, "label_filename")


def test_symlinks_are_followed_before_the_check(model_dir, tmp_path):
    (model_dir / "inside").symlink_to(model_dir / "labels.txt")
    (model_dir / "outside").symlink_to(tmp_path / "secret")
    assert confined(model_dir, "inside", "f") == (model_dir / "labels.txt").resolve()
    with pytest.raises(ConfigError, match="symbolic links"):
        confined(model_dir, "outside", "f")


def test_read_bounded_refuses_devices_fifos_and_large_files(model_dir):
    with pytest.raises(ConfigError, match="not a regular file"):
        read_bounded(__import__("pathlib").Path("/dev/zero"), 1024, "f")
    os.mkfifo(model_dir / "fifo")
    result: list = []
    reader = threading.Thread(target=lambda: result.append(pytest.raises(ConfigError, read_bounded,
                                                                         model_dir / "fifo", 10, "f")))
    reader.start()
    reader.join(5)
    assert not reader.is_alive() and result  # no writer on the FIFO: it must not hang
    with pytest.raises(ConfigError, match="more than the 3 allowed"):
        read_bounded(model_dir / "labels.txt", 3, "f")
    assert read_bounded(model_dir / "labels.txt", 4, "f") == b"a\nb\n"


def test_check_config_paths_names_the_field(model_dir):
    config = mc.ModelConfig(default_model_filename="../../secret")
    with pytest.raises(ConfigError, match="default_model_filename"):
        check_config_paths(config, model_dir, [model_dir / "1"])
    config = mc.ModelConfig(default_model_filename="/abs/model.onnx")
    with pytest.raises(ConfigError, match="absolute"):
        check_config_paths(config, model_dir, [])
    config = mc.ModelConfig()
    config.model_warmup.add(name="w").inputs["x"].input_data_file = "../../../secret"
    with pytest.raises(ConfigError, match="model_warmup 'w' input 'x' input_data_file"):
        check_config_paths(config, model_dir, [])
    config = mc.ModelConfig(default_model_filename="model.onnx")
    config.output.add(name="y", label_filename="labels.txt")
    check_config_paths(config, model_dir, [model_dir / "1"])  # all inside: no error
