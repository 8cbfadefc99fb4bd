"""Sample inputs from a model's config, accuracy against a reference, and timing."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from appliance.core.datatypes import CONFIG_TO_V2, numpy_dtype
from appliance.core.model_files import MAX_WARMUP_BYTES, WARMUP_DIR, confined, read_bounded
from appliance.core.bytes_tensor import decode_bytes_tensor
from appliance.errors import ConfigError, InvalidInput

__all__ = ["max_abs_error", "sample_inputs", "time_runs", "within_tolerance"]


def _random(datatype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([str(v).encode() for v in rng.integers(0, 10, shape).ravel()], dtype=object).reshape(shape)
    dtype = numpy_dtype(datatype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 10, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _warmup_inputs(config: mc.ModelConfig, model_dir: Path, batch: int, rng: np.random.Generator) -> dict | None:
    """Inputs from the config's first model_warmup sample (Triton's format), if it has one."""
    if not config.model_warmup:
        return None
    inputs = {}
    for name, spec in config.model_warmup[0].inputs.items():
        datatype = CONFIG_TO_V2[mc.DataType.Name(spec.data_type)]
        shape = (batch, *spec.dims) if config.max_batch_size > 0 else tuple(spec.dims)
        source = spec.WhichOneof("input_data_type")
        if source == "zero_data":
            inputs[name] = np.zeros(shape, dtype=numpy_dtype(datatype)) if datatype != "BYTES" else \
                np.full(shape, b"0", dtype=object)
        elif source == "input_data_file":
            one = _warmup_file(model_dir, name, spec, datatype)
            inputs[name] = np.stack([one] * batch) if config.max_batch_size > 0 else one
        else:
            inputs[name] = _random(datatype, shape, rng)
    return inputs


def _warmup_file(model_dir: Path, name: str, spec: mc.ModelWarmup.Input, datatype: str) -> np.ndarray:
    """A warmup input's data file (inside <model>/warmup/), which must hold exactly the declared dims."""
    field = f"model_warmup input '{name}' input_data_file"
    path = confined(model_dir, f"{WARMUP_DIR}/{spec.input_data_file}", field)
    dims = tuple(spec.dims)
    if any(d < 0 for d in dims):
        raise ConfigError(f"{field}: model_warmup dims must be fixed sizes, got {list(dims)}")
    if datatype == "BYTES":  # length-prefixed elements, as Triton reads them
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


def sample_inputs(config: mc.ModelConfig, model_dir: Path, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """One request's inputs at ``batch`` (ignored for unbatched models); open dimensions become 1."""
    rng = np.random.default_rng(seed)
    from_warmup = _warmup_inputs(config, model_dir, batch, rng)
    if from_warmup is not None:
        return from_warmup
    inputs = {}
    for entry in config.input:
        dims = tuple(d if d > 0 else 1 for d in entry.dims)
        shape = (batch, *dims) if config.max_batch_size > 0 else dims
        inputs[entry.name] = _random(CONFIG_TO_V2[mc.DataType.Name(entry.data_type)], shape, rng)
    return inputs


def max_abs_error(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray]) -> float:
    worst = 0.0
    for name, expected in reference.items():
        got = candidate.get(name)
        if got is None or np.shape(got) != np.shape(expected):
            return float("inf")
        if expected.dtype == object:
            if list(got.ravel()) != list(expected.ravel()):
                return float("inf")
            continue
        difference = np.abs(np.asarray(got, np.float64) - np.asarray(expected, np.float64))
        if difference.size:
            worst = max(worst, float(np.nanmax(difference)) if not np.isnan(difference).all() else float("inf"))
    return worst


def within_tolerance(reference: Mapping[str, np.ndarray], error: float, atol: float, rtol: float) -> bool:
    scale = max((float(np.max(np.abs(v))) for v in reference.values() if v.dtype != object and v.size), default=0.0)
    return error <= atol + rtol * scale


def time_runs(run: Callable[[], object], budget: float, min_runs: int = 5, max_runs: int = 200) -> float:
    """Median seconds per call after warm-up, sampling for about ``budget`` seconds."""
    for _ in range(3):
        run()
    samples: list[float] = []
    started = time.perf_counter()
    while len(samples) < min_runs or (time.perf_counter() - started < budget and len(samples) < max_runs):
        begin = time.perf_counter()
        run()
        samples.append(time.perf_counter() - begin)
    return statistics.median(samples)
