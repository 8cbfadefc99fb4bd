"""The tensors the sequence batcher adds to a request before it runs: one per ``control_input``
(START, END, READY, CORRID) and the sequence's implicit state (``state``), each one batch row.

A batch slot with no request (the direct strategy runs slots 0..n together) gets READY false, START
and END false, CORRID 0 and the initial state; its outputs are thrown away.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import BackendRequest
from appliance.core.kept import remember
from appliance.core.tensors import numpy_dtype
from appliance.engine.scheduler.correlation import END, START
from appliance.engine.scheduler.sequence_policy import Control, SequencePolicy, StateSpec, sequence_policy
from appliance.engine.scheduler.sequence_slots import Row

__all__ = ["control_tensors", "initial_states", "padding_inputs", "sequence_sample", "step_requests",
           "with_sequence_tensors"]


def _row(value: object, datatype: str, batched: bool) -> np.ndarray:
    """One control value as a batch row: [[value]] when the model batches, else [value] (one C call: this
    runs for every control of every request)."""
    if datatype == "BYTES":
        text = value if isinstance(value, str) else ""  # only an empty slot has no string ID
        return np.array([[text.encode()]] if batched else [text.encode()], dtype=object)
    return np.array([[value]] if batched else [value], dtype=numpy_dtype(datatype))


def _string_id_as_number(corrid: str, datatype: str) -> object:
    """What Triton 2.51 puts in a numeric CORRID for a string ID: the first bytes of the ID as a BYTES
    tensor element (its 4-byte length, then its text) read as that number (zeros past the end)."""
    dtype = numpy_dtype(datatype)
    element = len(corrid.encode()).to_bytes(4, "little") + corrid.encode()
    return np.frombuffer(element[: dtype.itemsize].ljust(dtype.itemsize, b"\0"), dtype=dtype)[0]


def _control_value(control: Control, flags: int, corrid: int | str, ready: bool) -> object:
    if control.kind == "corrid":
        if isinstance(corrid, str) and control.datatype != "BYTES":
            return _string_id_as_number(corrid, control.datatype)
        return corrid
    kind = control.kind
    on = bool(flags & START) if kind == "start" else bool(flags & END) if kind == "end" else ready
    return control.false_true[1 if on else 0]


_ROWS: dict[tuple[object, str, bool], np.ndarray] = {}
"""A START, END or READY control's rows by value, datatype and batching: each step gets a copy (a copy of
one costs a quarter of making it from its value)."""
_KEPT_ROWS = 1024


def control_tensors(policy: SequencePolicy, flags: int, corrid: int | str, ready: bool = True) -> dict[str, np.ndarray]:
    """One request's control inputs (shape [1, 1] when the model batches, else [1])."""
    batched = policy.batched
    tensors = {}
    for control in policy.controls:
        value = _control_value(control, flags, corrid, ready)
        if control.kind == "corrid":  # (a sequence's own: made each time)
            tensors[control.name] = _row(value, control.datatype, batched)
            continue
        key = (value, control.datatype, batched)
        row = _ROWS.get(key)
        if row is None:
            row = _row(value, control.datatype, batched)
            remember(_ROWS, key, row, _KEPT_ROWS)
        tensors[control.name] = row.copy()
    return tensors


def _state_row(spec: StateSpec, batched: bool) -> np.ndarray:
    return spec.initial[np.newaxis].copy() if batched else spec.initial.copy()


def initial_states(policy: SequencePolicy) -> dict[str, np.ndarray]:
    """A new sequence's implicit state, keyed by the model input that takes it (one batch row)."""
    return {spec.input: _state_row(spec, policy.batched) for spec in policy.states}


def padding_inputs(template: Mapping[str, np.ndarray], policy: SequencePolicy) -> dict[str, np.ndarray]:
    """An empty slot's inputs: zeros shaped as a real request of the same batch, READY false."""
    inputs = {name: np.full(value.shape, b"", dtype=object) if value.dtype == object else np.zeros_like(value)
              for name, value in template.items()}
    inputs.update(control_tensors(policy, 0, 0, ready=False))
    return inputs


def step_requests(policy: SequencePolicy, rows: list[Row | None]) -> list[BackendRequest]:
    """One step's batch as the backend takes it: each request with its control tensors and its sequence's
    state (a sequence that starts gets its initial state here), and an empty slot's padding request."""
    state_outputs = tuple(spec.output for spec in policy.states)
    requests: list[BackendRequest | None] = []
    template: dict[str, np.ndarray] | None = None
    for row in rows:
        if row is None:
            requests.append(None)
            continue
        sequence, request = row
        if request.flags & START or not sequence.state:
            sequence.state = initial_states(policy)
        feed = {**request.inputs, **control_tensors(policy, request.flags, sequence.corrid), **sequence.state}
        template = template or feed
        outputs = tuple(dict.fromkeys((*request.outputs, *state_outputs))) if state_outputs else request.outputs
        requests.append(BackendRequest(feed, outputs, request.parameters, 1, request_id=request.request_id,
                                       correlation_id=sequence.corrid, flags=request.flags, sink=request.sink,
                                       cancelled=request.cancelled))
    assert template is not None
    padding = None
    if None in requests:
        padding = BackendRequest(padding_inputs(template, policy), (), {}, 1, padding=True)
    return [r if r is not None else padding for r in requests]  # type: ignore[misc]


def sequence_sample(policy: SequencePolicy, batch: int) -> dict[str, np.ndarray]:
    """Control and state tensors for ``batch`` rows of sequence starts: what tuning and warmup add to a
    sample so a sequence model runs outside the batcher."""
    rows = [{**control_tensors(policy, START, index + 1), **initial_states(policy)} for index in range(max(batch, 1))]
    if not policy.batched:
        return rows[0]
    return {name: np.concatenate([row[name] for row in rows]) for name in rows[0]}


def with_sequence_tensors(config: mc.ModelConfig, inputs: Mapping[str, np.ndarray],
                          batch: int) -> dict[str, np.ndarray]:
    """``inputs`` (as the runtime takes them) plus, for a sequence model, the control and state tensors of
    ``batch`` sequence starts; unchanged for any other model."""
    if not config.HasField("sequence_batching"):
        return dict(inputs)
    return {**inputs, **sequence_sample(sequence_policy(config, None), batch)}
