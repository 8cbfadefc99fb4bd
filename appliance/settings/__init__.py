"""Settings: one frozen object of typed sections (``appliance.settings.sections``), built once from
defaults, a TOML file, the environment and flags.

Precedence (lowest first): built-in defaults, the TOML file (``--config`` or ``APPLIANCE_CONFIG``),
``APPLIANCE_<KEY>`` environment variables, command-line flags. Nothing else in the daemon reads the
environment; it receives a ``Settings``, and each component only its section.

    settings = load_settings(flags, os.environ, config_file)
    settings.http.port, settings.limits.max_request_bytes, settings.server.state_dir
    Settings.build(state_dir=path, metrics=False)   # flat keys, as in the file or the environment
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from appliance.settings.loading import ENV_PREFIX, SECTIONS, Settings, default_state_dir, from_flat, load_values

__all__ = ["ENV_PREFIX", "SECTIONS", "Settings", "default_state_dir", "load_settings"]


def load_settings(flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
                  config_file: Path | None = None) -> Settings:
    """Build the settings; ``flags`` holds only options the user gave (None values are ignored)."""
    return from_flat(load_values(flags or {}, env or {}, config_file))
