"""Triton's JSON rendering of a model configuration.

A leaf, like appliance.core.tensors: the core renders configs for the API with it, and the Python backend
hands the same JSON to model.py.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor
from google.protobuf.message import Message

__all__ = ["config_to_json"]


def _is_repeated(field: descriptor.FieldDescriptor) -> bool:
    # protobuf >= 5.28 has is_repeated and deprecates label; older releases have only label.
    if hasattr(field, "is_repeated"):
        return bool(field.is_repeated)
    return field.label == descriptor.FieldDescriptor.LABEL_REPEATED


def _value_to_json(field: descriptor.FieldDescriptor, value: Any) -> Any:
    if field.type == descriptor.FieldDescriptor.TYPE_MESSAGE:
        return _message_to_json(value)
    if field.type == descriptor.FieldDescriptor.TYPE_ENUM:
        known = field.enum_type.values_by_number.get(value)
        return known.name if known is not None else value
    if field.type == descriptor.FieldDescriptor.TYPE_BYTES:
        return value.decode("latin-1")
    return value


def _message_to_json(message: Message) -> dict[str, Any]:
    """Like Triton: snake_case names, every non-oneof field printed, int64 kept as numbers."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _value_to_json(value_field, v) for k, v in value.items()}
        elif _is_repeated(field):
            out[field.name] = [_value_to_json(field, v) for v in value]
        elif field.containing_oneof is not None or field.type == descriptor.FieldDescriptor.TYPE_MESSAGE:
            # Oneof members and sub-messages appear only when set, as Triton prints them.
            if message.HasField(field.name):
                out[field.name] = _value_to_json(field, value)
        else:
            out[field.name] = _value_to_json(field, value)
    return out


def config_to_json(config: Message) -> dict[str, Any]:
    """A ``ModelConfig`` as Triton renders it (model config API, the Python backend's ``model_config``)."""
    return _message_to_json(config)
