"""Triton's ``model_warmup``: the samples a config declares, built as requests, and run on every
instance of a model version before it is ready.

Triton's semantics: a sample gives each input ``zero_data``, ``random_data`` (zeros for strings) or an
``input_data_file`` under ``<model>/warmup/`` (raw row-major values; strings as 4-byte length prefixes
followed by the bytes), with dims that leave out the batch dimension; ``batch_size`` duplicates the
inputs that many times (1 for a model without batching); ``count`` runs the sample that many times
(0 means once). A sample that fails fails the load, with its name and the runtime's reason.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import Backend, BackendRequest
from appliance.core.errors import ApplianceError, ConfigError, InvalidInput
from appliance.core.tensors import CONFIG_TO_V2, decode_bytes_tensor, numpy_dtype
from appliance.engine.model_files import MAX_WARMUP_BYTES, WARMUP_DIR, confined, read_bounded
from appliance.engine.scheduler.state import with_sequence_tensors
from appliance.engine.signature import input_reshapes

__all__ = ["WarmupSample", "random_tensor", "run_warmup", "warmup_samples"]

log = logging.getLogger(__name__)

WARMUP_ANSWER_TIMEOUT = 60.0
"""Seconds a warmup run waits for an answer the model sends after its batch returned."""


@dataclasses.dataclass(frozen=True, slots=True)
class WarmupSample:
    name: str
    batch: int
    """Items in the request: the sample's batch_size for a batching model, else 1."""
    inputs: dict[str, np.ndarray]
    """As a client sends them: the config's dims, led by the batch dimension when the model batches."""
    count: int
    """Executions per instance."""


def random_tensor(datatype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Values of ``datatype``: small integers, booleans, standard normal floats, or digits as strings."""
    if datatype == "BYTES":
        return np.array([str(v).encode() for v in rng.integers(0, 10, shape).ravel()], dtype=object).reshape(shape)
    dtype = numpy_dtype(datatype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 10, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def warmup_samples(config: mc.ModelConfig, model_dir: Path, seed: int = 0) -> list[WarmupSample]:
    """The config's warmup samples, checked against its inputs; ConfigError says what to fix."""
    rng = np.random.default_rng(seed)
    return [_build_sample(config, model_dir, index, sample, rng) for index, sample in enumerate(config.model_warmup)]


def _build_sample(config: mc.ModelConfig, model_dir: Path, index: int, sample: mc.ModelWarmup,
                  rng: np.random.Generator) -> WarmupSample:
    label = f"model '{config.name}' model_warmup sample '{sample.name or index}'"
    batching = config.max_batch_size > 0
    if batching and not 1 <= sample.batch_size <= config.max_batch_size:
        raise ConfigError(f"{label}: batch_size must be 1..{config.max_batch_size} (the model's max_batch_size), "
                          f"got {sample.batch_size}")
    if not batching and sample.batch_size > 1:
        raise ConfigError(f"{label}: batch_size must be 1 for a model without batching (max_batch_size: 0), "
                          f"got {sample.batch_size}")
    declared = {entry.name: entry for entry in config.input}
    inputs: dict[str, np.ndarray] = {}
    for name, spec in sample.inputs.items():
        entry = declared.get(name)
        if entry is None:
            raise ConfigError(f"{label}: '{name}' is not an input of the model; its inputs are {sorted(declared)}")
        if spec.data_type != entry.data_type:
            raise ConfigError(f"{label}: input '{name}' has data_type {mc.DataType.Name(spec.data_type)}, but the "
                              f"model's input is {mc.DataType.Name(entry.data_type)}")
        dims = tuple(spec.dims)
        if len(dims) != len(entry.dims) or any(d < 0 or (e >= 0 and d != e) for d, e in zip(dims, entry.dims)):
            raise ConfigError(f"{label}: input '{name}' has dims {list(dims)}, which do not fit the input's dims "
                              f"{list(entry.dims)} (fixed sizes, without the batch dimension)")
        one = _item_data(model_dir, label, name, spec, CONFIG_TO_V2[mc.DataType.Name(spec.data_type)], dims, rng)
        inputs[name] = np.stack([one] * sample.batch_size) if batching else one
    missing = [entry.name for entry in config.input if entry.name not in inputs and not entry.optional]
    if missing:
        raise ConfigError(f"{label} gives no data for input(s) {missing}; add them to the sample's inputs")
    return WarmupSample(sample.name or str(index), sample.batch_size if batching else 1, inputs, max(1, sample.count))


def _item_data(model_dir: Path, label: str, name: str, spec: mc.ModelWarmup.Input, datatype: str,
               dims: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    source = spec.WhichOneof("input_data_type")
    if source == "input_data_file":
        return _read_data_file(model_dir, f"{label} input '{name}' input_data_file", spec.input_data_file,
                               datatype, dims, name)
    if datatype == "BYTES":  # Triton falls back to zero data (empty strings) for random strings
        return np.full(dims, b"", dtype=object)
    if source == "random_data":
        return random_tensor(datatype, dims, rng)
    return np.zeros(dims, dtype=numpy_dtype(datatype))


def _read_data_file(model_dir: Path, field: str, filename: str, datatype: str, dims: tuple[int, ...],
                    name: str) -> np.ndarray:
    """A data file inside <model>/warmup/, which must hold exactly the declared dims."""
    path = confined(model_dir, f"{WARMUP_DIR}/{filename}", field)
    if datatype == "BYTES":
        try:
            return decode_bytes_tensor(read_bounded(path, MAX_WARMUP_BYTES, field), math.prod(dims), name).reshape(dims)
        except InvalidInput as exc:
            raise ConfigError(f"{field}: {exc.message}") from None
    dtype = numpy_dtype(datatype)
    expected = math.prod(dims) * dtype.itemsize
    raw = read_bounded(path, min(expected, MAX_WARMUP_BYTES), field)
    if len(raw) != expected:
        raise ConfigError(f"{field}: {path.name} has {len(raw)} bytes; dims {list(dims)} of {datatype} need {expected}")
    return np.frombuffer(raw, dtype=dtype).reshape(dims)


def run_warmup(instances: Sequence[Backend], samples: Sequence[WarmupSample], config: mc.ModelConfig,
               version: int) -> None:
    """Run every sample ``count`` times on every instance (blocking, before the version serves)."""
    if not samples:
        return
    reshapes = input_reshapes(config)
    outputs = [entry.name for entry in config.output]
    for sample in samples:
        feed = with_sequence_tensors(config, {name: value.reshape(reshapes[name]) if name in reshapes else value
                                              for name, value in sample.inputs.items()}, sample.batch)
        for index, backend in enumerate(instances):
            for _ in range(sample.count):
                try:
                    (result,) = backend.run_requests([BackendRequest(feed, outputs, size=sample.batch)]).results
                    if isinstance(result, Future):  # answered by the model after the batch returned
                        result = result.result(timeout=WARMUP_ANSWER_TIMEOUT)
                    if isinstance(result, BaseException):
                        raise result
                except Exception as exc:
                    reason = exc.message if isinstance(exc, ApplianceError) else f"{type(exc).__name__}: {exc}"
                    raise ConfigError(
                        f"model '{config.name}' version {version}: model_warmup sample '{sample.name}' failed on "
                        f"instance {index}: {reason}; fix the sample in config.pbtxt (dims, data_type, the file "
                        f"under {config.name}/{WARMUP_DIR}/) or remove it"
                    ) from exc
    runs = sum(sample.count for sample in samples)
    log.info("model %s version %d: warmed up with %d sample(s), %d run(s) on each of %d instance(s)",
             config.name, version, len(samples), runs, len(instances))
