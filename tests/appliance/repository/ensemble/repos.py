"""Ensemble repositories the ensemble tests build: config text writers, ONNX steps and Python steps."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from appliance.engine.types import InferInput, InferRequest, RequestedOutput
from tests.builders import affine_model, two_output_model, write_model
from tests.models import copy_model

Tensor = tuple[str, str, list[int]]
"""(name, config data type such as TYPE_FP32, dims without the batch dimension)."""


def _tensors(kind: str, tensors: Iterable[Tensor]) -> str:
    entries = ", ".join(f'{{ name: "{n}" data_type: {t} dims: {list(d)} }}' for n, t, d in tensors)
    return f"{kind} [ {entries} ]\n" if entries else ""


def step(model: str, inputs: Mapping[str, str], outputs: Mapping[str, str], version: int = -1) -> str:
    maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: {version}{maps} }}'


def ensemble_config(inputs: Iterable[Tensor], outputs: Iterable[Tensor], steps: Iterable[str],
                    max_batch_size: int = 8, extra: str = "") -> str:
    return (f'platform: "ensemble"\nmax_batch_size: {max_batch_size}\n' + _tensors("input", inputs)
            + _tensors("output", outputs) + extra
            + "ensemble_scheduling { step [ " + ", ".join(steps) + " ] }\n")


def write_ensemble(repo: Path, name: str, config: str) -> Path:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(config)
    return repo / name


F8 = [8]
X = np.arange(16, dtype=np.float32).reshape(2, 8)
"""The ensemble tests' input: two rows of eight."""


def request(*outputs: str, x: np.ndarray = X) -> InferRequest:
    """A request of ``x`` (as ``IN``) asking for ``outputs`` (none: every output)."""
    return InferRequest([InferInput("IN", "FP32", x)], [RequestedOutput(name) for name in outputs])


def chain_repository(repo: Path) -> Path:
    """``double`` (x -> 2x) and ``plus_one`` (x -> x + 1), both FP32 [batch, 8] with dynamic batching, and
    ``chain`` = plus_one(double(IN)) exposing both the intermediate and the final tensor."""
    batching = "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 20000 }\n"
    write_model(repo, "double", affine_model(2.0, 0.0), config=batching)
    write_model(repo, "plus_one", affine_model(1.0, 1.0), config=batching)
    write_ensemble(repo, "chain", ensemble_config(
        [("IN", "TYPE_FP32", F8)], [("DOUBLED", "TYPE_FP32", F8), ("OUT", "TYPE_FP32", F8)],
        [step("double", {"x": "IN"}, {"y": "DOUBLED"}), step("plus_one", {"x": "DOUBLED"}, {"y": "OUT"})],
    ))
    return repo


def diamond_repository(repo: Path) -> Path:
    """``diamond``: two_outputs(IN) -> (d, s); plus_one(d) and double(s) run side by side -> (A, B)."""
    chain_repository(repo)
    write_model(repo, "two_outputs", two_output_model(8), config="max_batch_size: 8\n")
    write_ensemble(repo, "diamond", ensemble_config(
        [("IN", "TYPE_FP32", F8)], [("A", "TYPE_FP32", F8), ("B", "TYPE_FP32", F8)],
        [step("two_outputs", {"x": "IN"}, {"double": "d", "square": "s"}),
         step("plus_one", {"x": "d"}, {"y": "A"}),
         step("double", {"x": "s"}, {"y": "B"})],
    ))
    return repo


def parallel_repository(repo: Path) -> Path:
    """``parallel``: two_outputs(IN) -> (d, s); sleeper_a(d) and sleeper_b(s), two Python models that each
    sleep 0.3 s (tests/models/ensemble/sleeper), run side by side -> (A, SPAN_A, B, SPAN_B)."""
    diamond_repository(repo)
    for name in ("sleeper_a", "sleeper_b"):
        copy_model(repo, "ensemble/sleeper", name)
    write_ensemble(repo, "parallel", ensemble_config(
        [("IN", "TYPE_FP32", F8)],
        [("A", "TYPE_FP32", F8), ("SPAN_A", "TYPE_FP64", [2]), ("B", "TYPE_FP32", F8), ("SPAN_B", "TYPE_FP64", [2])],
        [step("two_outputs", {"x": "IN"}, {"double": "d", "square": "s"}),
         step("sleeper_a", {"x": "d"}, {"y": "A", "span": "SPAN_A"}),
         step("sleeper_b", {"x": "s"}, {"y": "B", "span": "SPAN_B"})],
    ))
    return repo


def nested_repository(repo: Path) -> Path:
    """``outer`` = plus_one(chain(IN)): an ensemble with an ensemble as its first step."""
    chain_repository(repo)
    write_ensemble(repo, "outer", ensemble_config(
        [("IN", "TYPE_FP32", F8)], [("FINAL", "TYPE_FP32", F8)],
        [step("chain", {"IN": "IN"}, {"OUT": "inner_out"}), step("plus_one", {"x": "inner_out"}, {"y": "FINAL"})],
    ))
    return repo
