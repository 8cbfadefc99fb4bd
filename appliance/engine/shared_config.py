"""The server-wide settings of the response cache and the rate limiter, parsed from Triton's flag syntax
(``--cache-config local,size=N``, ``--rate-limit-resource NAME:COUNT[:DEVICE]``). A leaf: the settings
check them without importing what runs them."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from appliance.errors import ConfigError

__all__ = ["CacheConfig", "ResourceLimit"]


@dataclasses.dataclass(frozen=True, slots=True)
class CacheConfig:
    """The server's ``cache_config`` (Triton's ``--cache-config <cache>,<setting>=<value>``): only the
    ``local`` cache, with its one setting ``size`` in bytes."""

    size: int

    @classmethod
    def parse(cls, entries: Iterable[str]) -> CacheConfig | None:
        """``("local,size=1048576",)``, or the same split at its commas (how a comma-separated setting
        arrives from the environment); nothing given is no cache."""
        tokens = [token.strip() for entry in entries for token in str(entry).split(",") if token.strip()]
        if not tokens:
            return None
        cache: str | None = None
        settings: dict[str, str] = {}
        for token in tokens:
            if "=" not in token:
                if cache is not None and token != cache:
                    raise ConfigError(f"cache_config names two caches ({cache!r} and {token!r}); this server "
                                      "has one cache implementation: local,size=<bytes>")
                cache = token
                continue
            if cache is None:
                raise ConfigError(f"cache_config {','.join(tokens)!r}: no cache specified; the format is "
                                  "<cache name>,<setting>=<value>, e.g. local,size=1048576")
            key, _, value = token.partition("=")
            if not key or not value:
                raise ConfigError(f"cache_config option format is '<cache name>,<setting>=<value>'. Got {token!r}")
            settings[key.strip()] = value.strip()
        if cache != "local":
            raise ConfigError(f"cache_config: unknown cache {cache!r}; this server implements the 'local' cache "
                              "(local,size=<bytes>)")
        unknown = sorted(set(settings) - {"size"})
        if unknown:
            raise ConfigError(f"cache_config: the local cache has no setting {', '.join(unknown)}; it takes "
                              "size=<bytes>")
        if "size" not in settings:
            raise ConfigError("cache_config: the local cache needs its size: local,size=<bytes>")
        try:
            size = int(settings["size"])
        except ValueError:
            raise ConfigError(f"cache_config: size must be a number of bytes, got {settings['size']!r}") from None
        if size < 1024:
            raise ConfigError(f"cache_config: size {size} is too small to hold a response; give at least 1024 "
                              "bytes, or leave cache_config out to run without a cache")
        return cls(size)


@dataclasses.dataclass(frozen=True, slots=True)
class ResourceLimit:
    """One entry of the server's ``rate_limit_resources`` (Triton's ``--rate-limit-resource``)."""

    name: str
    count: int
    device: int | None = None
    """None: the count applies to every device (and to a global resource of that name)."""

    @classmethod
    def parse(cls, text: str) -> ResourceLimit:
        problem = ("rate_limit_resources entry format is '<resource_name>:<count>:<device>' or "
                   f"'<resource_name>:<count>'. Got {text!r}")
        parts = text.strip().split(":")
        if len(parts) not in (2, 3) or not parts[0]:
            raise ConfigError(problem)
        try:
            count = int(parts[1])
            device = int(parts[2]) if len(parts) == 3 else None
        except ValueError:
            raise ConfigError(problem) from None
        if count < 0 or (device is not None and device < 0):
            raise ConfigError(f"{problem}: the count and the device must be >= 0")
        return cls(parts[0].lower(), count, device)
