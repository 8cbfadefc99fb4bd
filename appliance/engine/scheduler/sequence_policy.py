"""Triton's ``sequence_batching`` as a policy: the strategy and its knobs, the control tensors the
batcher injects (``control_input``) and the implicit state it carries (``state``).

``check_sequence_config`` runs with every config check (config.pbtxt or the load API), before anything
loads; ``sequence_policy`` builds the policy once the model's files are at hand (an initial state may
come from ``<model>/initial_state/<data_file>``).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from appliance.core.errors import ConfigError
from appliance.core.tensors import CONFIG_TO_V2, numpy_dtype
from appliance.engine.model_files import confined, read_bounded

__all__ = [
    "DEFAULT_IDLE_US",
    "INITIAL_STATE_DIR",
    "MAX_INITIAL_STATE_BYTES",
    "Control",
    "SequencePolicy",
    "StateSpec",
    "check_sequence_config",
    "hidden_tensors",
    "sequence_policy",
]

DEFAULT_IDLE_US = 1_000_000
"""Triton's max_sequence_idle_microseconds when the config leaves it 0."""
INITIAL_STATE_DIR = "initial_state"
MAX_INITIAL_STATE_BYTES = 64 << 20

_SB = mc.ModelSequenceBatching
_KINDS = {
    _SB.Control.CONTROL_SEQUENCE_START: "start",
    _SB.Control.CONTROL_SEQUENCE_END: "end",
    _SB.Control.CONTROL_SEQUENCE_READY: "ready",
    _SB.Control.CONTROL_SEQUENCE_CORRID: "corrid",
}
_FLAG_FORMS = (("fp32_false_true", "FP32"), ("int32_false_true", "INT32"), ("bool_false_true", "BOOL"))
CORRID_TYPES = ("UINT64", "INT64", "UINT32", "INT32", "BYTES")


@dataclasses.dataclass(frozen=True, slots=True)
class Control:
    """One control input: the tensor ``name`` the model reads, what it carries, and how."""

    name: str
    kind: str
    """start, end, ready or corrid."""
    datatype: str
    """The tensor's v2 datatype (FP32/INT32/BOOL for flags; the config's data_type for corrid)."""
    false_true: tuple[float | int | bool, float | int | bool] = (0, 1)


@dataclasses.dataclass(frozen=True, slots=True)
class StateSpec:
    """One implicit state: fed to ``input`` each step, replaced by the model's ``output``."""

    input: str
    output: str
    datatype: str
    dims: tuple[int, ...]
    initial: np.ndarray
    """The state a sequence starts with (no batch dimension)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SequencePolicy:
    strategy: str
    """direct or oldest."""
    max_batch_size: int
    idle_timeout: float
    """Seconds a sequence with nothing queued keeps its slot before it is ended."""
    max_queue_delay: float
    minimum_slot_utilization: float = 0.0
    max_candidate_sequences: int = 0
    """oldest: sequences one instance batches from; more wait in the backlog."""
    preferred_batch_sizes: tuple[int, ...] = ()
    preserve_ordering: bool = False
    controls: tuple[Control, ...] = ()
    states: tuple[StateSpec, ...] = ()
    iterative: bool = False
    """``iterative_sequence``: a request without a sequence ID starts a sequence of its own; the model may
    release it with RESCHEDULE to run it again in a later batch; the sequence ends when it completes."""

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0

    @property
    def slots_per_instance(self) -> int:
        if self.strategy == "oldest":
            return self.max_candidate_sequences
        return max(self.max_batch_size, 1)

    @property
    def corrid(self) -> Control | None:
        return next((c for c in self.controls if c.kind == "corrid"), None)


def hidden_tensors(config: mc.ModelConfig) -> tuple[set[str], set[str]]:
    """The inputs and outputs the sequence batcher feeds and reads itself: never client-facing (a state
    output stays visible when the config lists it among the outputs, as Triton allows for debugging)."""
    if not config.HasField("sequence_batching"):
        return set(), set()
    batching = config.sequence_batching
    inputs = {c.name for c in batching.control_input} | {s.input_name for s in batching.state}
    declared = {o.name for o in config.output}
    outputs = {s.output_name for s in batching.state if s.output_name not in declared}
    return inputs, outputs


def _control(where: str, entry: mc.ModelSequenceBatching.ControlInput) -> Control:
    if not entry.name:
        raise ConfigError(f"{where}: sequence_batching control_input needs a name (the model input it feeds)")
    if len(entry.control) != 1:
        raise ConfigError(
            f"{where}: sequence_batching control_input '{entry.name}' must hold exactly one control, "
            f"got {len(entry.control)}; declare one control_input per model input"
        )
    control = entry.control[0]
    kind = _KINDS.get(control.kind)
    if kind is None:
        raise ConfigError(f"{where}: control_input '{entry.name}' has an unknown kind {control.kind}")
    if kind == "corrid":
        datatype = CONFIG_TO_V2.get(mc.DataType.Name(control.data_type), "")
        if datatype not in CORRID_TYPES:
            raise ConfigError(
                f"{where}: CONTROL_SEQUENCE_CORRID control '{entry.name}' needs data_type TYPE_UINT64, TYPE_INT64, "
                f"TYPE_UINT32, TYPE_INT32 or TYPE_STRING, got {mc.DataType.Name(control.data_type)}"
            )
        return Control(entry.name, kind, datatype)
    forms = [(field, datatype) for field, datatype in _FLAG_FORMS if len(getattr(control, field))]
    if len(forms) != 1:
        raise ConfigError(
            f"{where}: control_input '{entry.name}' ({mc.ModelSequenceBatching.Control.Kind.Name(control.kind)}) "
            "needs exactly one of fp32_false_true, int32_false_true or bool_false_true, e.g. "
            "int32_false_true: [ 0, 1 ]"
        )
    field, datatype = forms[0]
    values = tuple(getattr(control, field))
    if len(values) != 2:
        raise ConfigError(f"{where}: control_input '{entry.name}' {field} must hold two values [false, true]")
    return Control(entry.name, kind, datatype, (values[0], values[1]))


def _state_shape(where: str, state: mc.ModelSequenceBatching.State) -> tuple[str, tuple[int, ...]]:
    if not state.input_name or not state.output_name:
        raise ConfigError(f"{where}: every sequence_batching state needs input_name and output_name")
    datatype = CONFIG_TO_V2.get(mc.DataType.Name(state.data_type), "")
    if not datatype or datatype == "BF16":
        raise ConfigError(f"{where}: state '{state.input_name}' needs a data_type such as TYPE_FP32")
    if not state.dims or any(d < -1 or d == 0 for d in state.dims) or len(state.dims) > 64:
        raise ConfigError(
            f"{where}: state '{state.input_name}' needs dims (without the batch dimension), each -1 or a size "
            f"> 0, got {list(state.dims)[:65]}"
        )
    return datatype, tuple(state.dims)


def check_sequence_config(config: mc.ModelConfig, where: str) -> None:
    """Refuse a sequence_batching section the batcher cannot honour, saying what to change."""
    if not config.HasField("sequence_batching"):
        return
    batching = config.sequence_batching
    names = [_control(where, entry).name for entry in batching.control_input]
    for state in batching.state:
        _state_shape(where, state)
        if len(state.initial_state) > 1:
            raise ConfigError(f"{where}: state '{state.input_name}' may have one initial_state, got "
                              f"{len(state.initial_state)}")
        names.append(state.input_name)
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ConfigError(f"{where}: sequence_batching feeds {duplicated} more than once; name each input once")
    clients = {entry.name for entry in config.input}
    overlap = sorted(clients & set(names))
    if overlap:
        raise ConfigError(
            f"{where}: {overlap} are fed by the sequence batcher (control_input or state) and must not be listed "
            "in input as well: clients never send them"
        )
    if batching.WhichOneof("strategy_choice") == "oldest":
        oldest = batching.oldest
        if oldest.max_candidate_sequences < 0:
            raise ConfigError(f"{where}: oldest max_candidate_sequences must be >= 0")
        bad = [p for p in oldest.preferred_batch_size if p < 1 or (config.max_batch_size and p > config.max_batch_size)]
        if bad:
            raise ConfigError(
                f"{where}: oldest preferred_batch_size {bad} must lie in 1..max_batch_size ({config.max_batch_size})"
            )
    elif not 0.0 <= batching.direct.minimum_slot_utilization <= 1.0:
        raise ConfigError(f"{where}: direct minimum_slot_utilization must lie in 0.0..1.0")
    if batching.max_sequence_idle_microseconds > 24 * 3600 * 1_000_000:
        raise ConfigError(f"{where}: max_sequence_idle_microseconds is above a day; sequences would never be freed")


def _initial_state(state: mc.ModelSequenceBatching.State, datatype: str, dims: tuple[int, ...],
                   model_dir: Path | None, where: str) -> np.ndarray:
    """Triton starts a state from zeros, from a file, or (no initial_state) from unspecified data with every
    variable dimension 1: here zeros, so a model that ignores START still starts the same way each time."""
    if not state.initial_state:
        return np.zeros(tuple(1 if d < 0 else d for d in dims), numpy_dtype(datatype))
    initial = state.initial_state[0]
    label = f"{where}: state '{state.input_name}' initial_state"
    init_type = CONFIG_TO_V2.get(mc.DataType.Name(initial.data_type), datatype) if initial.data_type else datatype
    if init_type != datatype or init_type == "BYTES":
        raise ConfigError(
            f"{label} has data_type {init_type}; it must be the state's own numeric "
            f"data_type ({datatype})"
        )
    shape = tuple(initial.dims)
    if any(d < 0 for d in shape) or len(shape) != len(dims) or any(d != s and d >= 0 for d, s in zip(dims, shape)):
        raise ConfigError(
            f"{label} dims {list(shape)} must be fixed sizes matching the state dims "
            f"{list(dims)}"
        )
    dtype = numpy_dtype(datatype)
    if initial.WhichOneof("state_data") == "data_file" and model_dir is not None:
        path = confined(model_dir, f"{INITIAL_STATE_DIR}/{initial.data_file}",
                        f"state '{state.input_name}' initial_state data_file")
        raw = read_bounded(path, MAX_INITIAL_STATE_BYTES, f"{label} data_file")
        expected = math.prod(shape) * dtype.itemsize
        if len(raw) != expected:
            raise ConfigError(
                f"{label} data_file {initial.data_file} holds {len(raw)} bytes; dims "
                f"{list(shape)} of {datatype} need {expected} (raw values, row-major)"
            )
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    return np.zeros(shape, dtype)


def sequence_policy(config: mc.ModelConfig, model_dir: Path | None) -> SequencePolicy:
    """The policy of a checked config (``check_sequence_config`` passed). Without ``model_dir`` an initial
    state from a data file is zeros (enough to run the model outside the batcher: tuning, warmup)."""
    where = f"model '{config.name}'"
    batching = config.sequence_batching
    controls = tuple(_control(where, entry) for entry in batching.control_input)
    states = []
    for state in batching.state:
        datatype, dims = _state_shape(where, state)
        initial = _initial_state(state, datatype, dims, model_dir, where)
        states.append(StateSpec(state.input_name, state.output_name, datatype, dims, initial))
    idle_us = batching.max_sequence_idle_microseconds or DEFAULT_IDLE_US
    common: dict[str, Any] = {"max_batch_size": config.max_batch_size, "idle_timeout": idle_us / 1e6,
                              "controls": controls, "states": tuple(states), "iterative": batching.iterative_sequence}
    if batching.WhichOneof("strategy_choice") == "oldest":
        oldest = batching.oldest
        return SequencePolicy(
            strategy="oldest",
            max_queue_delay=oldest.max_queue_delay_microseconds / 1e6,
            # Triton's default: as many candidates as one batch holds.
            max_candidate_sequences=oldest.max_candidate_sequences or max(config.max_batch_size, 1),
            preferred_batch_sizes=tuple(sorted(set(oldest.preferred_batch_size))),
            preserve_ordering=oldest.preserve_ordering,
            **common,
        )
    direct = batching.direct
    return SequencePolicy(strategy="direct", max_queue_delay=direct.max_queue_delay_microseconds / 1e6,
                          minimum_slot_utilization=direct.minimum_slot_utilization, **common)
