"""The ``args`` dict Triton hands to ``initialize(args)``, for a model run in its own process or in the
daemon's."""

from __future__ import annotations

import json

from appliance.backends.base import LoadContext

__all__ = ["initialize_args"]


def initialize_args(context: LoadContext, config_json: dict) -> dict[str, str]:
    group = 0
    index = context.instance_index
    # Triton names instances <model>_<group>_<index in group> (instance_group entries in order).
    for position, entry in enumerate(context.config.instance_group):
        count = entry.count if entry.count > 0 else 1
        if index < count:
            group = position
            break
        index -= count
    return {
        "model_config": json.dumps(config_json),
        "model_instance_kind": "CPU",
        "model_instance_name": f"{context.model_name}_{group}_{index}",
        "model_instance_device_id": "0",
        "model_repository": str(context.version_dir.parent),
        "model_version": str(context.version),
        "model_name": context.model_name,
    }
