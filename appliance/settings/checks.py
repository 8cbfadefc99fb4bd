"""How a settings section checks its own values: each refusal is a ``ConfigError`` that names the setting
by its key (what the operator wrote) and what it must be; and ``key()``, a field whose key is not its
name."""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import Any

from appliance.core.errors import ConfigError

__all__ = ["field_key", "fill", "flat_key", "key", "require_at_least", "require_networks", "require_one_of",
           "require_port", "require_positive"]


def key(default: Any, name: str) -> Any:
    """A field whose flat name (environment, TOML top level, flag) is ``name``."""
    return dataclasses.field(default=default, metadata={"key": name})


def require_positive(section: object, *names: str) -> None:
    for name in names:
        if not getattr(section, name) > 0:
            raise ConfigError(f"{flat_key(section, name)} must be > 0, got {getattr(section, name)}")


def require_at_least(section: object, low: int, *names: str) -> None:
    for name in names:
        if getattr(section, name) < low:
            raise ConfigError(f"{flat_key(section, name)} must be at least {low}, got {getattr(section, name)}")


def require_one_of(section: object, name: str, choices: tuple[str, ...]) -> None:
    if getattr(section, name) not in choices:
        raise ConfigError(f"{flat_key(section, name)} must be {', '.join(choices[:-1])} or {choices[-1]}, got "
                          f"{getattr(section, name)!r}")


def require_networks(section: object, *names: str) -> None:
    for name in names:
        for network in getattr(section, name):
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                raise ConfigError(f"{flat_key(section, name)}: {network!r} is not a network such as "
                                  "192.168.1.0/24") from None


def require_port(section: object, name: str) -> None:
    if not 0 <= getattr(section, name) <= 65535:
        raise ConfigError(f"{flat_key(section, name)} must be 0..65535, got {getattr(section, name)}")


def flat_key(section: object, name: str) -> str:
    """The key a field of ``section`` is set by (its name unless ``key()`` gave another)."""
    field = next(f for f in dataclasses.fields(section) if f.name == name)  # type: ignore[arg-type]
    return field_key(type(section), field)


def field_key(cls: type, field: dataclasses.Field) -> str:
    """``field``'s key in section class ``cls``: a key a shared base declares (``"{prefix}_use_ssl"``) takes
    the class's ``PREFIX`` and ``PORT``."""
    return fill(cls, field.metadata.get("key", field.name))


def fill(cls: type, text: str) -> str:
    """``text`` with ``{prefix}`` and ``{port}`` filled in from ``cls`` (a text without them as it is)."""
    if "{prefix}" in text or "{port}" in text:
        return text.replace("{prefix}", cls.PREFIX).replace("{port}", cls.PORT)  # type: ignore[attr-defined]
    return text
