"""A Python model's own environment (Triton's ``EXECUTION_ENV_PATH`` parameter), seen from the daemon.

``parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }``
names a packed environment (conda-pack or venv-pack archive), unpacked once into the model cache keyed by
its digest (model_cache.environments), or an environment directory used in place. It must lie inside
the model's directory (``$$TRITON_MODEL_DIRECTORY`` is that directory). The model process then starts
with the environment's interpreter, its packages first; as with Triton, the environment needs the
daemon's Python minor version and numpy, nothing of the appliance: the model-process side of the
appliance (``appliance.backends.python.model_process.stub`` and what it imports, numpy and the standard library only)
comes from the daemon through a directory on ``PYTHONPATH`` that holds the ``appliance`` package alone.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from appliance.backends.base import LoadContext
from appliance.core.errors import ConfigError
from model_cache.environments import BrokenEnvironment, UnpackLimits, interpreter, unpack_environment

__all__ = ["ENV_PARAMETER", "ModelEnvironment", "model_environment"]

ENV_PARAMETER = "EXECUTION_ENV_PATH"
_MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"
_PROBE = ("import sys; print('%d.%d' % sys.version_info[:2]);\n"
          "try:\n import numpy; print(numpy.__version__)\nexcept ImportError:\n print('')")


@dataclasses.dataclass(frozen=True, slots=True)
class ModelEnvironment:
    path: Path
    """The environment's directory (unpacked, or as named)."""
    python: Path
    """Its interpreter, which runs the model process."""
    appliance_path: Path
    """A directory holding only the ``appliance`` package, first on the model process's PYTHONPATH."""

    def process_environment(self, inherited: Mapping[str, str]) -> dict[str, str]:
        """The model process's environment variables: the environment's programs and libraries first."""
        env = {key: value for key, value in inherited.items()
               if key not in ("PYTHONHOME", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX")}
        env["PYTHONPATH"] = str(self.appliance_path)
        env["PATH"] = os.pathsep.join([str(self.path / "bin"), inherited.get("PATH", os.defpath)])
        libraries = [str(self.path / "lib"), *filter(None, [inherited.get("LD_LIBRARY_PATH")])]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libraries)
        env["CONDA_PREFIX"] = str(self.path)
        return env


def _named_path(context: LoadContext, value: str) -> Path:
    model_dir = context.version_dir.parent
    raw = value.replace(_MODEL_DIRECTORY, str(model_dir), 1) if value.startswith(_MODEL_DIRECTORY) else value
    path = Path(raw) if Path(raw).is_absolute() else model_dir / raw
    resolved = path.resolve()
    if not resolved.is_relative_to(model_dir.resolve()):
        raise ConfigError(f"model '{context.model_name}': {ENV_PARAMETER} {value[:200]!r} is outside the model's "
                          f"directory; put the environment in the model's directory and name it "
                          f"{_MODEL_DIRECTORY}/<file>")
    if not resolved.exists():
        raise ConfigError(f"model '{context.model_name}': {ENV_PARAMETER} names {path}, which does not exist; "
                          f"pack the environment (conda-pack or venv-pack) into {path}")
    return resolved


def _appliance_path(root: Path) -> Path:
    """``root/appliance-path/appliance`` -> the daemon's ``appliance`` package (made once)."""
    holder = root / "appliance-path"
    link = holder / "appliance"
    package = Path(__file__).resolve().parents[2]  # appliance/backends/python/environment.py
    if link.is_symlink() and link.resolve() == package:
        return holder
    holder.mkdir(parents=True, exist_ok=True)
    scratch = holder / f".appliance-{os.getpid()}"
    scratch.unlink(missing_ok=True)
    scratch.symlink_to(package, target_is_directory=True)
    os.replace(scratch, link)
    return holder


def _check_interpreter(context: LoadContext, python: Path, named: Path) -> None:
    try:
        probe = subprocess.run([str(python), "-I", "-c", _PROBE], capture_output=True, text=True, timeout=60,
                               stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"model '{context.model_name}': the Python of {ENV_PARAMETER} {named} does not run "
                          f"({exc}); pack the environment on a machine like this one") from None
    lines = probe.stdout.split("\n")
    if probe.returncode != 0 or len(lines) < 2:
        raise ConfigError(f"model '{context.model_name}': the Python of {ENV_PARAMETER} {named} does not run: "
                          f"{probe.stderr.strip()[-300:]}")
    wanted = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if lines[0] != wanted:
        raise ConfigError(f"model '{context.model_name}': {ENV_PARAMETER} {named} holds Python {lines[0]}, the "
                          f"daemon runs Python {wanted}; pack an environment of Python {wanted}")
    if not lines[1]:
        raise ConfigError(f"model '{context.model_name}': {ENV_PARAMETER} {named} has no numpy, which the model "
                          "process needs (as Triton's python backend does); install numpy in it and pack it again")


def model_environment(context: LoadContext, root: Path | None,
                      limits: UnpackLimits | None = None) -> ModelEnvironment | None:
    """The environment the model's config names (None: the daemon's own). ``root``: where archives are
    unpacked (the model cache's ``environments``; a temporary directory when None or not writable), within
    ``limits`` (the defaults when None). Blocking (it may unpack an archive and runs the interpreter once):
    call it off the event loop (the loader's thread calls it)."""
    value = context.parameter(ENV_PARAMETER)
    if value is None:
        return None
    named = _named_path(context, value)
    places = [root] if root is not None else []
    places.append(Path(tempfile.gettempdir()) / f"edge-appliance-environments-{os.getuid()}")
    for place in places:
        try:
            path = named if named.is_dir() else unpack_environment(named, place, limits or UnpackLimits())
            python = interpreter(path)
            shim = _appliance_path(place)
            break
        except BrokenEnvironment as exc:
            raise ConfigError(f"model '{context.model_name}': {exc}") from None
        except OSError as exc:
            if place is places[-1]:
                raise ConfigError(f"model '{context.model_name}': cannot unpack {ENV_PARAMETER} {named} into "
                                  f"{place}: {exc}") from None
    _check_interpreter(context, python, named)
    return ModelEnvironment(path, python, shim)
