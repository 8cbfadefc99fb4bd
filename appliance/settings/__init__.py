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

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from appliance.core.errors import ConfigError
from appliance.settings.loading import ENV_PREFIX, SECTIONS, default_state_dir, flat_fields, load_values
from appliance.settings.sections import (
    AuthSection,
    FleetSection,
    GrpcSection,
    HttpSection,
    LimitsSection,
    MetricsSection,
    ModelsSection,
    RateLimiterSection,
    ResponseCacheSection,
    SelectionSection,
    ServerSection,
    ShmSection,
    TraceSection,
)

__all__ = ["ENV_PREFIX", "SECTIONS", "Settings", "default_state_dir", "load_settings"]


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    server: ServerSection
    http: HttpSection = dataclasses.field(default_factory=HttpSection)
    grpc: GrpcSection = dataclasses.field(default_factory=GrpcSection)
    limits: LimitsSection = dataclasses.field(default_factory=LimitsSection)
    auth: AuthSection = dataclasses.field(default_factory=AuthSection)
    shm: ShmSection = dataclasses.field(default_factory=ShmSection)
    models: ModelsSection = dataclasses.field(default_factory=ModelsSection)
    selection: SelectionSection = dataclasses.field(default_factory=SelectionSection)
    metrics: MetricsSection = dataclasses.field(default_factory=MetricsSection)
    trace: TraceSection = dataclasses.field(default_factory=TraceSection)
    fleet: FleetSection = dataclasses.field(default_factory=FleetSection)
    response_cache: ResponseCacheSection = dataclasses.field(default_factory=ResponseCacheSection)
    rate_limiter: RateLimiterSection = dataclasses.field(default_factory=RateLimiterSection)

    def __post_init__(self) -> None:
        """What spans two sections."""
        grpc, http = self.grpc, self.http
        if grpc.enabled and grpc.port == http.port != 0:
            raise ConfigError(f"grpc_port and http_port are both {http.port}; give gRPC its own port "
                              "(--grpc-port, default 8001) or turn it off (--no-grpc)")
        if grpc.max_connections is not None and grpc.max_connections >= http.max_connections:
            raise ConfigError(f"grpc_max_connections ({grpc.max_connections}) must be below max_connections "
                              f"({http.max_connections}): the HTTP ports need connections too")

    @classmethod
    def build(cls, **values: Any) -> Settings:
        """Settings from flat keys (``state_dir=..., http_port=0, metrics=False``), values already typed."""
        return _from_flat(values)


def _from_flat(values: Mapping[str, Any]) -> Settings:
    fields = flat_fields()
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"unknown setting(s) {unknown}; known settings: {', '.join(sorted(fields))}")
    grouped: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for flat, value in values.items():
        section, name = fields[flat]
        grouped[section][name] = value
    return Settings(**{name: SECTIONS[name](**grouped[name]) for name in SECTIONS})


def load_settings(flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
                  config_file: Path | None = None) -> Settings:
    """Build the settings; ``flags`` holds only options the user gave (None values are ignored)."""
    return _from_flat(load_values(flags or {}, env or {}, config_file))
