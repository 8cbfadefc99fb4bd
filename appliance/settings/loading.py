"""Where each setting's value comes from: defaults, the TOML file (flat keys, or a section's table),
``APPLIANCE_<KEY>`` environment variables and flags; each value converted to its field's declared type."""

from __future__ import annotations

import dataclasses
import functools
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import platformdirs

from appliance.core.errors import ConfigError
from appliance.settings import sections
from appliance.settings.checks import field_key

__all__ = ["ENV_PREFIX", "SECTIONS", "Settings", "default_state_dir", "flat_fields", "from_flat", "load_values",
           "setting_types"]

ENV_PREFIX = "APPLIANCE_"


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    server: sections.ServerSection
    http: sections.HttpSection = dataclasses.field(default_factory=sections.HttpSection)
    grpc: sections.GrpcSection = dataclasses.field(default_factory=sections.GrpcSection)
    limits: sections.LimitsSection = dataclasses.field(default_factory=sections.LimitsSection)
    auth: sections.AuthSection = dataclasses.field(default_factory=sections.AuthSection)
    shm: sections.ShmSection = dataclasses.field(default_factory=sections.ShmSection)
    models: sections.ModelsSection = dataclasses.field(default_factory=sections.ModelsSection)
    selection: sections.SelectionSection = dataclasses.field(default_factory=sections.SelectionSection)
    metrics: sections.MetricsSection = dataclasses.field(default_factory=sections.MetricsSection)
    trace: sections.TraceSection = dataclasses.field(default_factory=sections.TraceSection)
    fleet: sections.FleetSection = dataclasses.field(default_factory=sections.FleetSection)
    response_cache: sections.ResponseCacheSection = dataclasses.field(default_factory=sections.ResponseCacheSection)
    rate_limiter: sections.RateLimiterSection = dataclasses.field(default_factory=sections.RateLimiterSection)

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
        return from_flat(values)


def from_flat(values: Mapping[str, Any]) -> Settings:
    """The settings from flat keys, values already typed; unknown keys are refused."""
    fields = flat_fields()
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"unknown setting(s) {unknown}; known settings: {', '.join(sorted(fields))}")
    grouped: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for flat, value in values.items():
        section, name = fields[flat]
        grouped[section][name] = value
    return Settings(**{name: SECTIONS[name](**grouped[name]) for name in SECTIONS})


SECTIONS: dict[str, type] = typing.get_type_hints(Settings)
"""Each section's name (its TOML table, its attribute of ``Settings``) and class, in documentation order:
read off ``Settings``'s fields, so that the list of sections is written once."""

_REMOVED: dict[str, str] = {
    "workers": "front-end workers were removed (they measured 0.70-0.93x the daemon alone: "
               "bench/results/NOTES.md); the daemon serves the HTTP port itself: remove workers",
    "grpc_transport": "the grpcio gRPC server was removed; the appliance's own HTTP/2 transport serves gRPC: "
                      "remove grpc_transport",
}
"""Settings that are no more (flat key -> what changed and the fix): given anywhere, they stop the daemon
rather than being ignored, so that nobody believes a setting is in force that is not."""
_REMOVED_FIELDS = {("http", "workers"): "workers", ("grpc", "transport"): "grpc_transport"}
"""The removed settings by their section's table and field name."""

# What systemd hands a service through its environment, under its own names.
_SYSTEMD = {"notify_socket": "NOTIFY_SOCKET", "watchdog_usec": "WATCHDOG_USEC"}
# What Triton's redis cache reads from the environment, under Triton's names (APPLIANCE_* ones win).
_TRITON = {"cache_redis_user": "TRITONCACHE_REDIS_USERNAME", "cache_redis_password": "TRITONCACHE_REDIS_PASSWORD"}


def default_state_dir(env: Mapping[str, str]) -> Path:
    # systemd's StateDirectory= exports STATE_DIRECTORY; elsewhere use the user's data dir.
    if env.get("STATE_DIRECTORY"):
        return Path(env["STATE_DIRECTORY"].split(":")[0])
    return Path(platformdirs.user_data_dir("appliance"))


@functools.cache
def flat_fields() -> dict[str, tuple[str, str]]:
    """Every setting's flat key -> (its section, its field's name there)."""
    found: dict[str, tuple[str, str]] = {}
    for section, cls in SECTIONS.items():
        for field in dataclasses.fields(cls):
            flat = field_key(cls, field)
            assert flat not in found, f"two settings have the key {flat!r}"
            found[flat] = (section, field.name)
    return found


@functools.cache
def setting_types() -> dict[str, Any]:
    """Every setting's flat key -> its declared type."""
    hints = {section: typing.get_type_hints(cls) for section, cls in SECTIONS.items()}
    return {flat: hints[section][name] for flat, (section, name) in flat_fields().items()}


def _convert(name: str, hint: Any, value: Any) -> Any:
    """Convert a TOML, environment or flag value to the field's declared type."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None or value == "":
            return None
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _convert(name, inner, value)
    try:
        if hint is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"expected true/false, got {value!r}")
        if origin is tuple:
            items = value.split(",") if isinstance(value, str) else list(value)
            return tuple(str(i).strip() for i in items if str(i).strip())
        if hint is Path:
            return Path(value).expanduser()
        return hint(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"setting {name!r}: cannot use {value!r} ({exc})") from exc


def _removed(name: str, where: str) -> ConfigError:
    """The error for a removed setting ``name`` (a flat key) given in ``where``."""
    return ConfigError(f"setting {name!r} ({where}): {_REMOVED[name]}")


def _read_file(config_file: Path) -> dict[str, Any]:
    """The file's settings as flat keys: top-level keys, and ``[section]`` tables of field names."""
    try:
        document = tomllib.loads(Path(config_file).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read settings file {config_file}: {exc}") from exc
    fields = flat_fields()
    values: dict[str, Any] = {}
    for name, value in document.items():
        if name in SECTIONS and isinstance(value, dict):
            by_field = {field: flat for flat, (section, field) in fields.items() if section == name}
            for field in value:
                if (name, field) in _REMOVED_FIELDS:
                    raise _removed(_REMOVED_FIELDS[name, field], f"[{name}] {field} in {config_file}")
            unknown = sorted(set(value) - set(by_field))
            if unknown:
                raise ConfigError(f"unknown setting(s) {unknown} in the [{name}] table of {config_file}; its "
                                  f"settings are: {', '.join(sorted(by_field))}")
            values.update({by_field[field]: item for field, item in value.items()})
        elif name in fields:
            values[name] = value
        elif name in _REMOVED:
            raise _removed(name, str(config_file))
        else:
            raise ConfigError(f"unknown setting(s) {[name]} in {config_file}; known settings: "
                              f"{', '.join(sorted(fields))} (or tables [{'], ['.join(SECTIONS)}])")
    return values


def load_values(flags: Mapping[str, Any], env: Mapping[str, str], config_file: Path | None) -> dict[str, Any]:
    """Every setting given anywhere, as flat keys, converted to its type (lowest precedence first)."""
    fields = flat_fields()
    values: dict[str, Any] = {"state_dir": default_state_dir(env)}
    values.update({name: env[variable] for name, variable in (_SYSTEMD | _TRITON).items() if env.get(variable)})
    if config_file is None and env.get(ENV_PREFIX + "CONFIG"):
        config_file = Path(env[ENV_PREFIX + "CONFIG"])
    if config_file is not None:
        values.update(_read_file(config_file))
    for name in _REMOVED:
        if ENV_PREFIX + name.upper() in env:
            raise _removed(name, ENV_PREFIX + name.upper())
    for name in fields:
        variable = ENV_PREFIX + name.upper()
        if variable in env:
            values[name] = env[variable]
    values.update({name: value for name, value in flags.items() if value is not None and name in fields})
    types_ = setting_types()
    return {name: _convert(name, types_[name], value) for name, value in values.items()}
