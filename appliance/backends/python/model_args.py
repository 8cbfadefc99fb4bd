"""The ``args`` dict Triton hands to ``initialize(args)``, for a model run in its own process or in the
daemon's."""

from __future__ import annotations

import json
from typing import Any

from appliance.backends.base import LoadContext

__all__ = ["initialize_args", "instance_name"]


def instance_name(context: LoadContext, config: Any = None) -> str:
    """Triton's name of an instance: its instance group's name (auto-completion names a config's default
    group after the model, its unnamed ones <model>_<group>), then the instance's index in the group.
    ``config``: the completed config (the load context's may predate auto-completion)."""
    index = context.instance_index
    groups = (config if config is not None else context.config).instance_group
    for position, group in enumerate(groups):
        count = group.count if group.count > 0 else 1
        if index < count:
            return f"{group.name or f'{context.model_name}_{position}'}_{index}"
        index -= count
    return f"{context.model_name}_0_{context.instance_index}"


def initialize_args(context: LoadContext, config_json: dict, config: Any = None) -> dict[str, str]:
    return {
        "model_config": json.dumps(config_json),
        "model_instance_kind": "CPU",
        "model_instance_name": instance_name(context, config),
        "model_instance_device_id": "0",
        "model_repository": str(context.version_dir.parent),
        "model_version": str(context.version),
        "model_name": context.model_name,
    }
