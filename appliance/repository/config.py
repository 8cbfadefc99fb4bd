"""Triton model configuration: parse config.pbtxt, auto-complete it from the model, render it as JSON
(appliance.core.config_json, which the backends use too).

The config is Triton's own ``ModelConfig`` protobuf message (shipped in ``tritonclient.grpc``), parsed
with protobuf's ``text_format``: a Triton repository loads here unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.core.config_json import config_to_json
from appliance.core.errors import ConfigError
from appliance.core.tensors import CONFIG_TO_V2, V2_TO_CONFIG, RuntimeTensor
from appliance.engine.model_files import MAX_CONFIG_BYTES, confined, read_bounded
from appliance.engine.scheduler.sequence_policy import check_sequence_config, hidden_tensors
from appliance.engine.signature import ModelSignature, TensorSpec

__all__ = [
    "CONFIG_FILENAME",
    "DEFAULT_MAX_BATCH_SIZE",
    "ENSEMBLE_PLATFORM",
    "as_reported",
    "complete_config",
    "config_from_json",
    "config_to_json",
    "check_decoupled",
    "is_ensemble",
    "read_config",
    "select_versions",
    "signature_of",
    "validate_config",
]

CONFIG_FILENAME = "config.pbtxt"
# Triton's default for --backend-config=default-max-batch-size when it can tell a model batches.
DEFAULT_MAX_BATCH_SIZE = 4
# Bounds a config must keep: a config from the load API is as untrusted as a request.
MAX_BATCH_SIZE = 1 << 20
MAX_DIMS = 64
MAX_INSTANCES = 256
ENSEMBLE_PLATFORM = "ensemble"


def is_ensemble(config: mc.ModelConfig) -> bool:
    """An ensemble (appliance.repository.ensemble) runs no backend: the registry loads it, not the loader."""
    return config.platform == ENSEMBLE_PLATFORM or config.HasField("ensemble_scheduling")


def read_config(model_dir: Path) -> mc.ModelConfig:
    """Parse ``<model_dir>/config.pbtxt``; a missing file gives an empty config to auto-complete."""
    config = mc.ModelConfig()
    path = model_dir / CONFIG_FILENAME
    if path.is_file() or path.is_symlink():
        raw = read_bounded(confined(model_dir, CONFIG_FILENAME, CONFIG_FILENAME), MAX_CONFIG_BYTES, CONFIG_FILENAME)
        try:
            text_format.Parse(raw.decode("utf-8"), config)
        except (text_format.ParseError, UnicodeDecodeError, RecursionError) as exc:
            raise ConfigError(f"{path}: not a valid Triton model configuration: {exc}") from exc
    return validate_config(config, model_dir.name, str(path))


def config_from_json(raw: Any, model_name: str) -> mc.ModelConfig:
    """A config sent to the load API (``parameters.config``, JSON text or an object), checked exactly as
    config.pbtxt is."""
    where = "parameters.config"
    try:
        document = orjson.loads(raw) if isinstance(raw, (str, bytes)) else raw
    except orjson.JSONDecodeError as exc:  # also refuses nesting deeper than 1024
        raise ConfigError(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ConfigError(f'{where} must be a JSON object such as {{"max_batch_size": 8}}')
    try:
        config = json_format.ParseDict(document, mc.ModelConfig())
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        raise ConfigError(f"{where} is not a Triton model configuration: {str(exc)[:500]}") from None
    return validate_config(config, model_name, where)


def check_decoupled(config: mc.ModelConfig, backend: str, supported: bool) -> None:
    """A decoupled model (any number of responses per request) needs a backend that can send them: with
    any other, every request would hang or answer once, so the model fails to load instead."""
    if config.model_transaction_policy.decoupled and not supported:
        raise ConfigError(
            f"model '{config.name}': the {backend} backend cannot serve decoupled models "
            "(model_transaction_policy { decoupled: true }): only the python backend sends several responses per "
            "request; drop the policy, or wrap the model in a Python model that sends the responses"
        )
    if config.model_transaction_policy.decoupled and config.response_cache.enable:
        # Triton's words (model_config_utils.cc); a decoupled model's responses are a stream, not one answer.
        raise ConfigError(
            f"Response Cache does not currently support model {config.name} with 'decoupled' transaction policy. "
            "Please disable the response cache."
        )
    if config.model_transaction_policy.decoupled and config.sequence_batching.state:
        raise ConfigError(
            f"model '{config.name}': implicit state (sequence_batching state) is carried from a step's outputs "
            "to the next step, but a decoupled model sends its outputs as responses, after its step may have "
            "ended; drop the state (keep it in the model) or the decoupled policy (Triton keeps implicit state "
            "for the onnxruntime, tensorrt and pytorch backends only)"
        )


def validate_config(config: mc.ModelConfig, model_name: str, where: str) -> mc.ModelConfig:
    """The checks every config passes, from a file or the load API; sets the name."""
    if config.name and config.name != model_name:
        raise ConfigError(
            f"{where}: name {config.name!r} differs from the model directory {model_name!r}; "
            "rename one of them or drop the name field"
        )
    config.name = model_name
    if not 0 <= config.max_batch_size <= MAX_BATCH_SIZE:
        raise ConfigError(f"{where}: max_batch_size must be 0..{MAX_BATCH_SIZE}, got {config.max_batch_size}")
    for kind, entries in (("input", config.input), ("output", config.output)):
        for entry in entries:
            if len(entry.dims) > MAX_DIMS or any(d < -1 for d in entry.dims):
                raise ConfigError(
                    f"{where}: {kind} {entry.name!r} has dims {list(entry.dims)[:MAX_DIMS + 1]}; each must be "
                    f"-1 (variable) or a size >= 0, at most {MAX_DIMS} of them"
                )
    total = 0
    for group in config.instance_group:
        if group.count < 0:
            raise ConfigError(f"{where}: instance_group count must be >= 0, got {group.count}")
        total += group.count
    if total > MAX_INSTANCES:
        raise ConfigError(f"{where}: {total} instances asked for; at most {MAX_INSTANCES} per model")
    if config.HasField("sequence_batching") and config.response_cache.enable:
        # Triton's words: a sequence's answers depend on its state, not only on the request's inputs.
        raise ConfigError(
            f"Response Cache does not currently support model {config.name} with sequence batching scheduler. "
            "Please disable the response cache."
        )
    check_sequence_config(config, where)
    if any(size < 1 for size in config.dynamic_batching.preferred_batch_size):
        raise ConfigError(f"{where}: dynamic_batching preferred_batch_size entries must be >= 1")
    return config


def select_versions(config: mc.ModelConfig, available: Iterable[int]) -> list[int]:
    """The versions the config's ``version_policy`` asks for, among those present, ascending."""
    present = sorted(set(available))
    policy = config.version_policy.WhichOneof("policy_choice")
    if policy == "all":
        return present
    if policy == "specific":
        wanted = set(config.version_policy.specific.versions)
        missing = sorted(wanted - set(present))
        if missing:
            raise ConfigError(
                f"model {config.name!r}: version_policy asks for version(s) {missing}, "
                f"but the repository has {present or 'none'}"
            )
        return sorted(wanted)
    count = config.version_policy.latest.num_versions if policy == "latest" else 1
    return present[-max(count, 1):]


def _runtime_dims(tensor: RuntimeTensor, batched: bool) -> list[int]:
    return list(tensor.shape[1:] if batched else tensor.shape)


def _can_batch(inputs: Sequence[RuntimeTensor], outputs: Sequence[RuntimeTensor]) -> bool:
    tensors = [*inputs, *outputs]
    return bool(tensors) and all(t.shape and t.shape[0] == -1 for t in tensors)


def _complete_tensors(
    kind: str,
    declared: Any,
    found: Sequence[RuntimeTensor],
    config: mc.ModelConfig,
) -> None:
    """Check the config's inputs or outputs against the model and add those it leaves out."""
    batched = config.max_batch_size > 0
    by_name = {t.name: t for t in found}
    for entry in declared:
        tensor = by_name.get(entry.name)
        if tensor is None:
            raise ConfigError(
                f"model {config.name!r}: config {kind} {entry.name!r} is not in the model; "
                f"the model's {kind}s are {sorted(by_name) or 'none'}"
            )
        want_type = V2_TO_CONFIG[tensor.datatype]
        if entry.data_type == mc.TYPE_INVALID:
            entry.data_type = mc.DataType.Value(want_type)
        elif mc.DataType.Name(entry.data_type) != want_type:
            raise ConfigError(
                f"model {config.name!r}: config {kind} {entry.name!r} has data_type "
                f"{mc.DataType.Name(entry.data_type)}, but the model's is {want_type}"
            )
        dims = _runtime_dims(tensor, batched)
        if not entry.dims and not entry.HasField("reshape"):
            entry.dims.extend(dims)
        elif not entry.HasField("reshape") and not _dims_compatible(list(entry.dims), dims):
            hint = " (with max_batch_size > 0, dims leave out the batch dimension)" if batched else ""
            raise ConfigError(
                f"model {config.name!r}: config {kind} {entry.name!r} has dims {list(entry.dims)}, "
                f"but the model's are {dims}{hint}"
            )
    named = {entry.name for entry in declared}
    for tensor in found:
        if tensor.name not in named:
            declared.add(
                name=tensor.name,
                data_type=mc.DataType.Value(V2_TO_CONFIG[tensor.datatype]),
                dims=_runtime_dims(tensor, batched),
            )


def _declared(kind: str, entries: Any, config: mc.ModelConfig) -> list[RuntimeTensor]:
    """The tensors a config declares, for a runtime that cannot describe its own."""
    if not entries:
        raise ConfigError(f"model {config.name!r}: the model file does not describe its {kind}s; declare them "
                          f"in config.pbtxt ({kind} [ {{ name: ... data_type: ... dims: [ ... ] }} ])")
    tensors = []
    for entry in entries:
        if entry.data_type == mc.TYPE_INVALID or not entry.dims:
            raise ConfigError(
                f"model {config.name!r}: config {kind} {entry.name!r} needs data_type and dims, because the "
                "model file does not describe its tensors"
            )
        batch = (-1,) if config.max_batch_size > 0 else ()
        datatype = CONFIG_TO_V2[mc.DataType.Name(entry.data_type)]
        tensors.append(RuntimeTensor(entry.name, datatype, (*batch, *entry.dims)))
    return tensors


def _dims_compatible(declared: list[int], found: list[int]) -> bool:
    return len(declared) == len(found) and all(
        d == f or f == -1 or d == -1 for d, f in zip(declared, found)
    )


# The platforms Triton's auto-complete writes into a config (AutoCompleteBackendFields); for other
# backends (python, openvino) it leaves ``platform`` empty and names only the backend.
_TRITON_PLATFORMS = frozenset({"onnxruntime_onnx", "pytorch_libtorch", "tensorrt_plan"})


def complete_config(
    config: mc.ModelConfig,
    *,
    platform: str,
    backend: str,
    default_filename: str,
    inputs: Sequence[RuntimeTensor] | None,
    outputs: Sequence[RuntimeTensor] | None,
    cpu_instances: int = 1,
) -> mc.ModelConfig:
    """Fill what Triton's auto-complete fills, from what the runtime reports; returns a new config.

    ``inputs``/``outputs`` None means the runtime cannot describe its tensors (TorchScript): the config
    must then declare each of them fully.
    """
    config = _copy(config)
    if inputs is not None:  # a runtime that describes its tensors: check what the sequence batcher feeds
        _check_sequence_tensors(config, inputs)
    if inputs is None:
        inputs = _declared("input", config.input, config)
    if outputs is None:
        outputs = _declared("output", config.output, config)
    if not config.platform and platform in _TRITON_PLATFORMS:
        config.platform = platform
    if not config.backend:
        config.backend = backend
    if not config.default_model_filename:
        config.default_model_filename = default_filename
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    declared_io = len(config.input) + len(config.output) > 0
    if config.max_batch_size == 0 and not declared_io and _can_batch(inputs, outputs):
        config.max_batch_size = DEFAULT_MAX_BATCH_SIZE
        scheduler = config.WhichOneof("scheduling_choice")
        if scheduler is None:
            # Triton enables the dynamic batcher when it auto-fills a batch size above 1.
            config.dynamic_batching.SetInParent()
    if config.max_batch_size > 0:
        for tensor in (*inputs, *outputs):
            if not tensor.shape or tensor.shape[0] not in (-1,):
                raise ConfigError(
                    f"model {config.name!r}: max_batch_size is {config.max_batch_size}, but "
                    f"{tensor.name!r} has shape {list(tensor.shape)} with a fixed first dimension; "
                    "set max_batch_size: 0 or export the model with a dynamic batch dimension"
                )
    hidden_inputs, hidden_outputs = hidden_tensors(config)
    _complete_tensors("input", config.input, [t for t in inputs if t.name not in hidden_inputs], config)
    _complete_tensors("output", config.output, [t for t in outputs if t.name not in hidden_outputs], config)
    if not config.instance_group:  # Triton's default group takes the model's name...
        config.instance_group.add(name=config.name, kind=mc.ModelInstanceGroup.KIND_CPU)
    for index, group in enumerate(config.instance_group):
        if not group.name:  # ...and a group the config left unnamed <model>_<index>
            group.name = f"{config.name}_{index}"
        if group.count < 1:
            # Triton's SetDefaultInstanceCount: 2 per CPU group for onnxruntime, else 1.
            group.count = cpu_instances if group.kind in (mc.ModelInstanceGroup.KIND_CPU,
                                                         mc.ModelInstanceGroup.KIND_AUTO) else 1
    if not config.HasField("optimization"):
        # What Triton's auto-complete adds to every model it runs itself (not ensembles).
        config.optimization.input_pinned_memory.enable = True
        config.optimization.output_pinned_memory.enable = True
    return config


def as_reported(config: mc.ModelConfig) -> mc.ModelConfig:
    """The config as Triton reports it: its auto-complete also writes ``preferred_batch_size:
    [max_batch_size]`` into a dynamic batcher that names none. The serving config keeps the list empty:
    the batcher then spreads queued work over idle instances instead of filling one batch."""
    if not (config.HasField("dynamic_batching") and config.max_batch_size > 0
            and not config.dynamic_batching.preferred_batch_size):
        return config
    reported = _copy(config)
    reported.dynamic_batching.preferred_batch_size.append(config.max_batch_size)
    return reported


def _check_sequence_tensors(config: mc.ModelConfig, inputs: Sequence[RuntimeTensor]) -> None:
    """The inputs the sequence batcher feeds must be model inputs of the datatype it feeds them with."""
    if not config.HasField("sequence_batching"):
        return
    found = {t.name: t.datatype for t in inputs}
    batching = config.sequence_batching
    wanted = [(s.input_name, CONFIG_TO_V2.get(mc.DataType.Name(s.data_type), "")) for s in batching.state]
    for entry in batching.control_input:
        control = entry.control[0]
        if control.kind == mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID:
            datatype = CONFIG_TO_V2.get(mc.DataType.Name(control.data_type), "")
        else:
            datatype = ("FP32" if control.fp32_false_true else "INT32" if control.int32_false_true else "BOOL")
        wanted.append((entry.name, datatype))
    for name, datatype in wanted:
        if name not in found:
            raise ConfigError(
                f"model {config.name!r}: sequence_batching feeds input {name!r}, which the model does not have; "
                f"its inputs are {sorted(found)}"
            )
        if found[name] != datatype:
            raise ConfigError(
                f"model {config.name!r}: sequence_batching feeds input {name!r} as {datatype}, but the model "
                f"takes {found[name]}; change the control's form (fp32/int32/bool_false_true) or data_type"
            )


def _copy(config: mc.ModelConfig) -> mc.ModelConfig:
    copy = mc.ModelConfig()
    copy.CopyFrom(config)
    return copy


def signature_of(config: mc.ModelConfig) -> ModelSignature:
    def spec(entry: Any) -> TensorSpec:
        return TensorSpec(
            name=entry.name,
            datatype=CONFIG_TO_V2[mc.DataType.Name(entry.data_type)],
            dims=tuple(entry.dims),
            optional=bool(getattr(entry, "optional", False)),
            label_filename=getattr(entry, "label_filename", ""),
        )

    return ModelSignature(
        max_batch_size=config.max_batch_size,
        inputs={entry.name: spec(entry) for entry in config.input},
        outputs={entry.name: spec(entry) for entry in config.output},
    )
