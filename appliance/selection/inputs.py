"""What a model is tuned with, best source first: its ``model_warmup`` samples, then synthetic inputs
built from its config (``reshape``, ``max_batch_size: 0``, fixed dims, datatypes) with several sizes tried
for the variable dimensions. A retune on real traffic tries the traffic's shapes before both.

A model with data-dependent shape rules (reflect padding that needs more samples than the padding,
framing into windows, tokenizers) refuses some sizes; the search keeps the first input set the model
runs, and records why the others were refused.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import Backend
from appliance.core.tensors import CONFIG_TO_V2
from appliance.engine.scheduler.state import with_sequence_tensors
from appliance.engine.signature import input_reshapes
from appliance.repository.warmup import random_tensor, warmup_samples
from appliance.selection.measure import error_reason

__all__ = ["DYNAMIC_SIZES", "MAX_SAMPLE_ELEMENTS", "InputSearch", "InputSet", "Sample", "tuning_inputs"]

log = logging.getLogger(__name__)

DYNAMIC_SIZES = (1, 16, 512, 16000)
"""Sizes tried, in order, for every variable (-1) dimension other than the batch dimension."""
MAX_SAMPLE_ELEMENTS = 1 << 24
"""A synthetic sample above this many elements is not built (a larger size is not tried; the top batch
shrinks to fit)."""


@dataclasses.dataclass(frozen=True)
class Sample:
    """One request: ``shapes`` as a client sends them, ``inputs`` as the runtime sees them (reshaped)."""

    batch: int
    shapes: dict[str, list[int]]
    inputs: dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class InputSet:
    source: str
    """traffic, warmup or synthetic: recorded as the decision's ``tuned_on``."""
    label: str
    samples: tuple[Sample, ...]

    def profile(self) -> list[dict[str, Any]]:
        """The shapes tuned on, as a decision records them."""
        return [{"batch": sample.batch, "shapes": sample.shapes} for sample in self.samples]


def _sample(batch: int, inputs: dict[str, np.ndarray], reshapes: dict[str, tuple[int, ...]]) -> Sample:
    shaped = {name: value.reshape(reshapes[name]) if name in reshapes else value for name, value in inputs.items()}
    return Sample(batch, {name: list(value.shape) for name, value in inputs.items()}, shaped)


def tuning_inputs(config: mc.ModelConfig, model_dir: Path, sizes: Sequence[int] = DYNAMIC_SIZES,
                  seed: int = 0, traffic: Mapping[str, Any] | None = None) -> Iterator[InputSet]:
    """Input sets to try, best first; built one at a time, so a large one exists only if it is tried.
    ``traffic`` (a profile from appliance.engine.traffic) comes first: a retune on traffic is for its shapes. A sequence
    model's samples carry its control and state tensors (sequence starts, initial state), as its batcher
    feeds them."""
    for candidate in _input_sets(config, model_dir, sizes, seed, traffic):
        samples = tuple(dataclasses.replace(s, inputs=with_sequence_tensors(config, s.inputs, s.batch))
                        for s in candidate.samples)
        yield dataclasses.replace(candidate, samples=samples)


def _input_sets(config: mc.ModelConfig, model_dir: Path, sizes: Sequence[int], seed: int,
                traffic: Mapping[str, Any] | None) -> Iterator[InputSet]:
    reshapes = input_reshapes(config)
    if traffic:
        yield _from_traffic(config, traffic, reshapes, np.random.default_rng(seed))
    if config.model_warmup:
        samples = warmup_samples(config, model_dir, seed)
        yield InputSet("warmup", "the config's model_warmup samples",
                       tuple(_sample(s.batch, s.inputs, reshapes) for s in samples))
    yield from _synthetic(config, reshapes, sizes, np.random.default_rng(seed))


def _from_traffic(config: mc.ModelConfig, traffic: Mapping[str, Any], reshapes: dict[str, tuple[int, ...]],
                  rng: np.random.Generator) -> InputSet:
    """Random values in the shapes real requests had (the values themselves are never kept)."""
    datatypes = {entry.name: CONFIG_TO_V2[mc.DataType.Name(entry.data_type)] for entry in config.input}
    samples = []
    for number, sample in enumerate(traffic["samples"]):
        shapes = {name: tuple(shape) for name, shape in sample["shapes"].items()}
        if number and sum(math.prod(shape) for shape in shapes.values()) > MAX_SAMPLE_ELEMENTS:
            continue  # the batch-1 sample is always kept
        inputs = {name: random_tensor(datatypes[name], shape, rng) for name, shape in shapes.items()}
        samples.append(_sample(sample["batch"], inputs, reshapes))
    return InputSet("traffic", "the shapes of the model's traffic", tuple(samples))


def _synthetic(config: mc.ModelConfig, reshapes: dict[str, tuple[int, ...]], sizes: Sequence[int],
               rng: np.random.Generator) -> Iterator[InputSet]:
    variable = any(d < 0 for entry in config.input for d in entry.dims)
    for number, size in enumerate(sizes if variable else sizes[:1]):
        dims = {entry.name: tuple(size if d < 0 else d for d in entry.dims) for entry in config.input}
        per_item = sum(math.prod(shape) for shape in dims.values())
        if number and per_item > MAX_SAMPLE_ELEMENTS:
            return  # larger sizes only grow; the first one is always tried
        batches = [1]
        if config.max_batch_size > 1:  # the top batch, shrunk to stay within the element bound
            batches.append(max(1, min(config.max_batch_size, MAX_SAMPLE_ELEMENTS // max(per_item, 1))))
        samples = []
        for batch in sorted(set(batches)):
            inputs = {
                entry.name: random_tensor(CONFIG_TO_V2[mc.DataType.Name(entry.data_type)],
                                          (batch, *dims[entry.name]) if config.max_batch_size > 0 else dims[entry.name],
                                          rng)
                for entry in config.input
            }
            samples.append(_sample(batch, inputs, reshapes))
        label = f"synthetic inputs, variable dimensions {size}" if variable else "synthetic inputs"
        yield InputSet("synthetic", label, tuple(samples))


class InputSearch:
    """The first input set the model runs. The sets are tried on the first candidate plan that builds,
    the fp32 reference: what it refuses is not a valid input, whatever another runtime makes of it
    (OpenVINO answers some shapes that onnxruntime refuses with empty outputs)."""

    def __init__(self, model: str, candidates: Iterable[InputSet], outputs: Sequence[str]) -> None:
        self._model = model
        self._candidates = candidates
        self.outputs = list(outputs)
        self.found: InputSet | None = None
        self.refused: list[dict[str, str]] = []
        """Input sets the reference refused, with the runtime's reason."""
        self.tried_on = 0
        """How many built plans asked for inputs."""

    def find(self, backend: Backend) -> InputSet | None:
        """The input set to measure ``backend`` with; the search runs on the first backend asking."""
        self.tried_on += 1
        if self.tried_on > 1:
            return self.found
        for candidate in self._candidates:
            try:
                for sample in candidate.samples:
                    backend.run(sample.inputs, self.outputs)
            except Exception as exc:  # the model refuses these shapes or values: try the next set
                self.refused.append({"inputs": candidate.label, "reason": error_reason(exc)})
                log.info("tuning %s: %s refused: %s", self._model, candidate.label, error_reason(exc))
                continue
            self.found = candidate
            break
        return self.found
