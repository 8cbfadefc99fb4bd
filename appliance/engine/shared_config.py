"""The server-wide settings of the response cache and the rate limiter, parsed from Triton's flag syntax
(``--cache-config local,size=N`` or ``redis,host=H``, ``--rate-limit-resource NAME:COUNT[:DEVICE]``). A
leaf: the settings check them without importing what runs them."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from appliance.core.errors import ConfigError

__all__ = ["CacheConfig", "RedisCacheConfig", "ResourceLimit"]


@dataclasses.dataclass(frozen=True, slots=True)
class CacheConfig:
    """The ``local`` cache of the server's ``cache_config`` (Triton's ``--cache-config local,size=N``): the
    responses in this process's memory, under ``size`` bytes."""

    size: int

    @classmethod
    def parse(cls, entries: Iterable[str], redis_user: str | None = None,
              redis_password: str | None = None) -> CacheConfig | RedisCacheConfig | None:
        """``("local,size=1048576",)`` or ``("redis,host=h", "redis,port=6379")``, or the same split at their
        commas (how a comma-separated setting arrives from the environment); nothing given is no cache.
        ``redis_user``, ``redis_password``: the redis cache's credentials where the entries name none (the
        settings take them from Triton's TRITONCACHE_REDIS_USERNAME and TRITONCACHE_REDIS_PASSWORD)."""
        parsed = _settings(entries)
        if parsed is None:
            return None
        cache, settings = parsed
        if cache == "redis":
            # As Triton's redis cache: the environment's credentials first, the cache_config's over them.
            fallback = {"user": redis_user, "password": redis_password}
            return RedisCacheConfig.of({**{k: v for k, v in fallback.items() if v}, **settings})
        if cache != "local":
            raise ConfigError(f"cache_config: unknown cache {cache!r}; this server implements the 'local' cache "
                              "(local,size=<bytes>) and the 'redis' cache (redis,host=<host> redis,port=<port>)")
        _known("local", settings, {"size"}, "size=<bytes>")
        if "size" not in settings:
            raise ConfigError("cache_config: the local cache needs its size: local,size=<bytes>")
        size = _integer("local", "size", settings["size"], "a number of bytes")
        if size < 1024:
            raise ConfigError(f"cache_config: size {size} is too small to hold a response; give at least 1024 "
                              "bytes, or leave cache_config out to run without a cache")
        return cls(size)


_REDIS_SETTINGS = {"host", "port", "user", "password", "db", "connect_timeout", "socket_timeout", "pool_size",
                   "wait_timeout", "cert", "key", "cacert", "cacert_dir", "tls_enabled", "tls", "ttl",
                   "max_entry_size"}


@dataclasses.dataclass(frozen=True, slots=True)
class RedisCacheConfig:
    """The ``redis`` cache: responses kept on a Redis server, shared by every appliance that uses it. The
    settings are Triton's redis cache's (host, port, user, password, db, the timeouts in milliseconds,
    tls_enabled and the TLS files) plus the appliance's ``ttl`` and ``max_entry_size``."""

    host: str
    port: int
    user: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    db: int = 0
    connect_timeout_ms: int = 1000
    socket_timeout_ms: int = 100
    """How long a lookup or an insertion may take before the request goes on uncached."""
    pool_size: int = 8
    wait_timeout_ms: int = 100
    tls: bool = False
    cert: str | None = None
    key: str | None = None
    cacert: str | None = None
    cacert_dir: str | None = None
    ttl: int = 0
    """Seconds an entry lives on the server (0: until Redis evicts it)."""
    max_entry_size: int = 16 << 20
    """Responses larger than this many bytes are not stored."""

    @classmethod
    def of(cls, settings: dict[str, str]) -> RedisCacheConfig:
        if "sni" in settings:
            raise ConfigError("cache_config: redis sni is not supported here (the Redis client names the host it "
                              "connects to); give the name the server's certificate holds as redis,host=<name>")
        _known("redis", settings, _REDIS_SETTINGS, "host=<host>, port=<port> and optionally "
               + ", ".join(sorted(_REDIS_SETTINGS - {"host", "port"})))
        if "host" not in settings or "port" not in settings:
            raise ConfigError("cache_config: the redis cache needs its address: --cache-config redis,host=<host> "
                              "--cache-config redis,port=<port>")
        port = _integer("redis", "port", settings["port"], "a TCP port")
        if not 0 < port < 65536:
            raise ConfigError(f"cache_config: redis port {port} is not a TCP port (1-65535)")

        def number(name: str, default: int, what: str, least: int = 0) -> int:
            if name not in settings:
                return default
            value = _integer("redis", name, settings[name], what)
            if value < least:
                raise ConfigError(f"cache_config: redis {name} must be at least {least}, got {value}")
            return value

        def flag(name: str) -> bool:
            value = settings[name].lower()
            if value not in ("true", "false", "1", "0", "yes", "no"):
                raise ConfigError(f"cache_config: redis {name} must be true or false, got {settings[name]!r}")
            return value in ("true", "1", "yes")

        files = {name: settings.get(name) or None for name in ("cert", "key", "cacert", "cacert_dir")}
        if bool(files["cert"]) != bool(files["key"]):
            raise ConfigError("cache_config: redis cert and key go together (a client certificate and its key); "
                              "give both or neither")
        # tls_enabled is Triton's name, tls the appliance's shorter one; without either, naming a TLS file
        # turns TLS on. Files named beside an explicit false would be silently unused: refused instead.
        said = [flag(name) for name in ("tls_enabled", "tls") if name in settings]
        if len(set(said)) > 1:
            raise ConfigError("cache_config: redis tls_enabled and tls disagree; give one of them")
        tls = said[0] if said else any(files.values())
        if not tls and any(files.values()):
            raise ConfigError("cache_config: redis TLS files are named but tls_enabled=false; drop the files or "
                              "set redis,tls_enabled=true")
        socket_timeout = number("socket_timeout", 100, "milliseconds")
        connect_timeout = number("connect_timeout", 1000, "milliseconds")
        return cls(
            host=settings["host"], port=port, user=settings.get("user") or None,
            password=settings.get("password") or None, db=number("db", 0, "a database number"),
            # Triton's 0 waits forever; a request never waits on the cache past the default here.
            connect_timeout_ms=connect_timeout or 1000, socket_timeout_ms=socket_timeout or 100,
            pool_size=number("pool_size", 8, "a number of connections", 1),
            wait_timeout_ms=number("wait_timeout", 100, "milliseconds"),
            tls=tls, ttl=number("ttl", 0, "seconds"),
            max_entry_size=number("max_entry_size", 16 << 20, "bytes", 1024), **files,
        )


def _settings(entries: Iterable[str]) -> tuple[str, dict[str, str]] | None:
    tokens = [token.strip() for entry in entries for token in str(entry).split(",") if token.strip()]
    if not tokens:
        return None
    cache: str | None = None
    settings: dict[str, str] = {}
    for token in tokens:
        if "=" not in token:
            if cache is not None and token != cache:
                raise ConfigError(f"cache_config names two caches ({cache!r} and {token!r}); a server runs one "
                                  "cache: local,size=<bytes> or redis,host=<host> redis,port=<port>")
            cache = token
            continue
        if cache is None:
            raise ConfigError(f"cache_config {','.join(tokens)!r}: no cache specified; the format is "
                              "<cache name>,<setting>=<value>, e.g. local,size=1048576")
        key, _, value = token.partition("=")
        if not key or not value:
            raise ConfigError(f"cache_config option format is '<cache name>,<setting>=<value>'. Got {token!r}")
        settings[key.strip()] = value.strip()
    if cache is None:
        raise ConfigError("cache_config: no cache specified; the format is <cache name>,<setting>=<value>")
    return cache, settings


def _known(cache: str, settings: dict[str, str], known: set[str], takes: str) -> None:
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ConfigError(f"cache_config: the {cache} cache has no setting {', '.join(unknown)}; it takes {takes}")


def _integer(cache: str, name: str, value: str, what: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"cache_config: {cache} {name} must be {what}, got {value!r}") from None


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
