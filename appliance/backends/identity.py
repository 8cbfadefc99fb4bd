"""Triton's ``identity`` backend (``backend: "identity"``): each OUTPUT<i> is a copy of INPUT<i>.

NVIDIA's qa repositories build test models and ensemble steps on it (qa/L0_decoupled's
``identity_int32``), with no model file: the config is the model. Its behaviour, as Triton's
identity_backend has it:

- the config pairs INPUT<i> with OUTPUT<i>: as many inputs as outputs, the same datatype and the same
  dims (or ``reshape`` shape) in each pair, else the load fails with Triton's words;
- an optional INPUT<i> a request leaves out gives an OUTPUT<i> of zeros (empty strings for BYTES) shaped
  as the config's dims with -1 read as 1, behind the request's batch dimension when the model batches;
- parameters ``execute_delay_ms`` (a sleep per execution, times ``instance_wise_delay_multiplier`` x the
  instance's index when that is set) and ``creation_delay_sec`` (a sleep while the model loads);
- every response carries the parameters param0..param3 that Triton's sets to show response parameters;
- the ``input_byte_size_counter`` metric family counts the bytes of every input copied, per model and
  version.

It never runs a decoupled model (Triton's does not either) and runs any instance group on the CPU.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends.base import (
    Backend,
    BackendRequest,
    BatchResult,
    LoadContext,
    ModelMetrics,
    Outputs,
    RequestResult,
)
from appliance.core.errors import ConfigError, InvalidInput
from appliance.core.tensors import CONFIG_TO_V2, numpy_dtype

__all__ = ["IdentityBackend", "RESPONSE_PARAMETERS"]

RESPONSE_PARAMETERS: Mapping[str, object] = {
    "param0": "an example string parameter", "param1": 42, "param2": False, "param3": 123.123}
"""What Triton's identity backend attaches to every response (to show response parameters)."""

_METRIC_FAMILY = "input_byte_size_counter"
_METRIC_DESCRIPTION = "Cumulative input byte size of all requests received by the model"
_COUNTER = 0  # appliance.metrics.custom.COUNTER, Triton's TRITONSERVER_METRIC_KIND_COUNTER

_IN, _OUT = "INPUT", "OUTPUT"


def _refuse(model: str, triton_words: str, fix: str) -> ConfigError:
    return ConfigError(f"{triton_words} (model '{model}', backend identity: {fix})")


def _shape(entry: mc.ModelInput | mc.ModelOutput) -> list[int]:
    return list(entry.reshape.shape) if entry.HasField("reshape") else list(entry.dims)


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"  # Triton's ShapeToString


def _check_pairs(model: str, config: mc.ModelConfig) -> dict[str, tuple[str, list[int]]]:
    """Triton's ValidateModelConfig: the optional inputs by index suffix ("0" for INPUT0), with their
    v2 datatype and config shape."""
    if len(config.input) != len(config.output):
        raise _refuse(model, "model configuration must have equal input/output pairs",
                      f"declare one OUTPUT<i> per INPUT<i>; it has {len(config.input)} input(s) and "
                      f"{len(config.output)} output(s)")
    inputs: dict[str, tuple[str, list[int]]] = {}
    outputs: dict[str, tuple[str, list[int]]] = {}
    optional: dict[str, tuple[str, list[int]]] = {}
    for entry, out in zip(config.input, config.output, strict=True):
        if not entry.name.startswith(_IN):
            raise _refuse(model, f"expected input name to follow INPUT<index> pattern, got '{entry.name}'",
                          "name the inputs INPUT0, INPUT1, ...")
        if not out.name.startswith(_OUT):
            raise _refuse(model, f"expected output name to follow OUTPUT<index> pattern, got '{out.name}'",
                          "name the outputs OUTPUT0, OUTPUT1, ...")
        datatype, shape = mc.DataType.Name(entry.data_type), _shape(entry)
        inputs.setdefault(entry.name[len(_IN):], (datatype, shape))
        outputs.setdefault(out.name[len(_OUT):], (mc.DataType.Name(out.data_type), _shape(out)))
        if entry.optional:
            optional[entry.name[len(_IN):]] = (CONFIG_TO_V2.get(datatype, ""), [1 if d == -1 else d for d in shape])
    for index in sorted(outputs):  # in the order Triton's std::map checks them
        if index not in inputs:
            raise _refuse(model, "expected input and output indices to match",
                          f"OUTPUT{index} has no INPUT{index}")
        (in_type, in_shape), (out_type, out_shape) = inputs[index], outputs[index]
        if in_type != out_type:
            raise _refuse(model, f"expected input and output datatype to match, got {in_type} and {out_type}",
                          f"give INPUT{index} and OUTPUT{index} the same data_type")
        if in_shape != out_shape:
            raise _refuse(model, f"expected input and output shape to match, got {_shape_text(in_shape)} and "
                                 f"{_shape_text(out_shape)}", f"give INPUT{index} and OUTPUT{index} the same dims")
    return optional


def _whole(context: LoadContext, key: str) -> int:
    text = context.parameter(key)
    if text is None:
        return 0
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise _refuse(context.model_name, f"parameter {key} is {text!r}",
                      f'set parameters {{ key: "{key}" value: {{ string_value: "<a whole number >= 0>" }} }}')
    return value


def _byte_size(array: np.ndarray) -> int:
    """The input's size as Triton counts it (BYTES: each element's 4-byte length prefix and its bytes)."""
    if array.dtype == object:
        return sum(4 + len(item) for item in array.flat)
    return int(array.nbytes)


def _zeros(datatype: str, shape: list[int]) -> np.ndarray:
    if datatype == "BYTES":
        return np.full(shape, b"", dtype=object)  # Triton zero-fills the buffer: every length 0
    return np.zeros(shape, numpy_dtype(datatype))


class IdentityBackend(Backend):
    """One instance of an identity model."""

    def __init__(self, context: LoadContext) -> None:
        config = context.config
        self._optional = _check_pairs(context.model_name, config)
        self._batching = config.max_batch_size > 0
        delay_ms = _whole(context, "execute_delay_ms")
        # Triton reads the multiplier only beside a delay; instance i waits delay x multiplier x i (at least 1x).
        multiplier = _whole(context, "instance_wise_delay_multiplier") if delay_ms else 0
        self._delay_s = delay_ms * max(multiplier * context.instance_index, 1) / 1000
        if self._delay_s:
            self.inline_safe = False
            self.inline_refusal = "the identity model sleeps execute_delay_ms in every execution"
        creation_delay = _whole(context, "creation_delay_sec")
        if creation_delay and context.instance_index == 0:  # once per model, as Triton's ModelInitialize
            time.sleep(creation_delay)
        self._metrics = self._open_metric(context)

    def _open_metric(self, context: LoadContext) -> tuple[ModelMetrics, int] | None:
        metrics = context.services.metrics if context.services is not None else None
        if metrics is None:
            return None
        try:
            metrics.family(self, _METRIC_FAMILY, _METRIC_DESCRIPTION, _COUNTER)
            metric = metrics.metric(self, _METRIC_FAMILY, {"model": context.model_name,
                                                           "version": str(context.version)}, None)
        except ValueError as exc:
            metrics.release(self)
            raise _refuse(context.model_name, str(exc),
                          f"another model defines a metric family {_METRIC_FAMILY!r} of its own; rename it") from None
        return metrics, metric

    def inputs(self) -> None:
        return None  # the config is the model: it declares every tensor

    def outputs(self) -> None:
        return None

    def run(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        if self._delay_s:
            time.sleep(self._delay_s)
        return self._answer(inputs, outputs)

    def run_requests(self, requests: Sequence[BackendRequest]) -> BatchResult:
        """One delay per execution, then each request on its own (they may leave out different optional
        inputs); a request that cannot be answered fails alone."""
        start = time.perf_counter_ns()
        if self._delay_s:
            time.sleep(self._delay_s)
        results: list[RequestResult] = []
        for request in requests:
            try:
                results.append(Outputs(self._answer(request.inputs, request.outputs), RESPONSE_PARAMETERS))
            except InvalidInput as exc:
                results.append(exc)
        return BatchResult(results, output_ns=time.perf_counter_ns() - start)

    def _answer(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        answer: dict[str, np.ndarray] = {}
        copied = 0
        for name in outputs:
            index = name[len(_OUT):]
            given = inputs.get(_IN + index)
            if given is not None:
                answer[name] = np.array(given, copy=True)  # never a view of the request's buffers
                copied += _byte_size(given)
            elif index in self._optional:
                datatype, shape = self._optional[index]
                first = next(iter(inputs.values()), None)
                batch = first.shape[0] if self._batching and first is not None and first.ndim else 0
                answer[name] = _zeros(datatype, [batch, *shape] if batch else shape)
            else:
                raise InvalidInput(f"failed to get input '{_IN}{index}' (the identity model answers {name} "
                                   f"with a copy of {_IN}{index}: send it)")
        if self._metrics is not None and copied:
            metrics, metric = self._metrics
            metrics.update(metric, "increment", copied)
        return answer

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics[0].release(self)
            self._metrics = None
