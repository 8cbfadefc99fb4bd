"""Files a model's configuration names, confined to the model's directory and read with a size bound.

A config (config.pbtxt on disk, or one sent to the load API) names files: the model file, label files,
warmup data. Each name is resolved, symbolic links included, and must stay inside the model's own
directory: a config may never make the daemon read, or run, a file elsewhere (Triton's CVE-2023-31036
was this class of hole). Files are read only if they are regular files, and never beyond a bound, so a
name like ``/dev/zero`` or a FIFO can neither grow the daemon nor hang it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from appliance.core.errors import ConfigError

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_LABEL_BYTES",
    "MAX_WARMUP_BYTES",
    "WARMUP_DIR",
    "check_config_paths",
    "confined",
    "read_bounded",
]

MAX_CONFIG_BYTES = 4 << 20
MAX_LABEL_BYTES = 16 << 20
MAX_WARMUP_BYTES = 256 << 20
WARMUP_DIR = "warmup"


def confined(model_dir: Path, name: str, field: str) -> Path:
    """``model_dir / name`` resolved; ConfigError naming ``field`` unless it lies inside ``model_dir``."""
    if not name or "\0" in name:
        raise ConfigError(f"model '{model_dir.name}': {field} must name a file inside the model's directory")
    if Path(name).is_absolute():
        raise ConfigError(
            f"model '{model_dir.name}': {field} {name!r} is an absolute path; name a file relative to "
            f"the model's directory {model_dir.name}/"
        )
    root = model_dir.resolve()
    path = (model_dir / name).resolve()
    if path == root or not path.is_relative_to(root):
        raise ConfigError(
            f"model '{model_dir.name}': {field} {name!r} resolves outside the model's directory; name a "
            f"file inside {model_dir.name}/ (symbolic links must point inside it too)"
        )
    return path


def read_bounded(path: Path, limit: int, field: str) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (blocking)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{field}: cannot read {path.name}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{field}: {path.name} is not a regular file")
        if info.st_size > limit:
            raise ConfigError(f"{field}: {path.name} has {info.st_size} bytes, more than the {limit} allowed")
        data = handle.read(limit + 1)
    if len(data) > limit:  # grew while being read
        raise ConfigError(f"{field}: {path.name} is larger than the {limit} bytes allowed")
    return data


def check_config_paths(config: mc.ModelConfig, model_dir: Path, versions: Iterable[Path]) -> None:
    """Every file the config names must lie inside ``model_dir`` (checked before anything loads)."""
    if config.default_model_filename:
        if Path(config.default_model_filename).is_absolute():
            raise ConfigError(
                f"model '{model_dir.name}': default_model_filename {config.default_model_filename!r} is an "
                "absolute path; name the file inside each version directory (e.g. model.onnx)"
            )
        for version_dir in versions:  # the model file of every version present
            confined(model_dir, f"{version_dir.name}/{config.default_model_filename}", "default_model_filename")
    for output in config.output:
        if output.label_filename:
            confined(model_dir, output.label_filename, f"output '{output.name}' label_filename")
    for state in config.sequence_batching.state:
        for initial in state.initial_state:
            if initial.WhichOneof("state_data") == "data_file":
                confined(model_dir, f"initial_state/{initial.data_file}",
                         f"state '{state.input_name}' initial_state data_file")
    for sample in config.model_warmup:
        for input_name, spec in sample.inputs.items():
            if spec.WhichOneof("input_data_type") == "input_data_file":
                confined(model_dir, f"{WARMUP_DIR}/{spec.input_data_file}",
                         f"model_warmup '{sample.name}' input '{input_name}' input_data_file")
