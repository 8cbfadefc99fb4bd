"""Settings: one typed, frozen object built once from defaults, a TOML file, the environment and flags.

Precedence (lowest first): built-in defaults, the TOML file (``--config`` or ``APPLIANCE_CONFIG``),
``APPLIANCE_<FIELD>`` environment variables, command-line flags. Nothing else in the daemon reads the
environment; it receives a ``Settings``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import platformdirs

from appliance.errors import ConfigError

__all__ = ["ENV_PREFIX", "Settings", "default_state_dir", "load_settings"]

ENV_PREFIX = "APPLIANCE_"


def default_state_dir(env: Mapping[str, str]) -> Path:
    # systemd's StateDirectory= exports STATE_DIRECTORY; elsewhere use the user's data dir.
    if env.get("STATE_DIRECTORY"):
        return Path(env["STATE_DIRECTORY"].split(":")[0])
    return Path(platformdirs.user_data_dir("appliance"))


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    state_dir: Path
    """Where the daemon keeps its files (token, cache, metrics). Always given: ``load_settings`` resolves
    it from the flag, the environment or the platform's data directory, never the working directory."""
    model_repository: Path | None = None
    """Triton-layout model repository; None serves the built-in example repository."""
    host: str = "0.0.0.0"
    http_port: int = 8000
    grpc: bool = True
    """Serve KServe v2 over gRPC (Triton's GRPCInferenceService) beside HTTP (``--no-grpc`` turns it off)."""
    grpc_port: int = 8001
    """The gRPC port (Triton's 8001); 0 picks a free one."""
    mdns: bool = True
    """Announce the box on the LAN (``_kserve-v2._tcp``, ``_http._tcp``)."""
    name: str | None = None
    """The box's friendly name on the LAN; default the hostname."""
    mdns_interfaces: tuple[str, ...] = ()
    """IPv4 addresses of the interfaces to announce on; empty means all."""
    log_level: str = "INFO"
    max_request_bytes: int = 256 * 1024 * 1024
    """Largest request body accepted, as sent and once decompressed (HTTP 413 above it)."""
    max_request_memory_bytes: int = 1024**3
    """Request bytes held in memory at once over all requests: bodies as they arrive, decompressed
    bodies, tensors decoded from JSON. Beyond it 503 with Retry-After; at least max_request_bytes."""
    max_connections: int = 4096
    """Client connections open at once (all ports); a connection beyond it gets a short 503 and is
    closed. Kept below the file-descriptor limit (the unit's LimitNOFILE=)."""
    header_timeout: float = 60.0
    """Seconds a connection may take to send a complete request head, and may stay idle between
    requests; then it is closed (nginx's client_header_timeout)."""
    body_timeout: float = 60.0
    """Seconds a request body may go without a byte arriving; then 408 (nginx's client_body_timeout)."""
    onnx_providers: tuple[str, ...] = ("CPUExecutionProvider",)
    """onnxruntime execution providers to try, in order of preference."""
    intra_op_threads: int = 0
    """Threads each runtime may use inside one operator; 0 lets the runtime decide."""
    event_loop: str = "auto"
    """auto (uvloop when installed, else asyncio's), uvloop or asyncio."""
    model_control_mode: str = "none"
    """Triton's: none (load all, no load/unload API), poll (re-scan every repository_poll_secs),
    explicit (load load_models at start; the API loads and unloads)."""
    load_models: tuple[str, ...] = ()
    """Models to load at start in explicit mode ("*" for all)."""
    repository_poll_secs: float = 15.0
    selection: bool = True
    """Measure which plan (runtime, provider, device) runs each model fastest here, and cache it."""
    retune: bool = False
    """Ignore cached plan decisions and measure again."""
    tune_budget: float = 0.3
    """Seconds of timing per candidate plan and batch size."""
    retune_on_traffic: bool = True
    """Tune a served model again on its requests' shapes when it could not be measured at load, or when
    most of its requests have shapes it was not tuned on; switch to the new plan without downtime."""
    retune_interval: float = 600.0
    """Seconds between two retunes of one model."""
    retune_min_requests: int = 100
    """Requests a model version serves before its traffic is judged."""
    cache_max_bytes: int = 2 * 1024**3
    """Size bound of the model cache (least recently used entries are evicted)."""
    metrics: bool = True
    """Keep on-device history in <state_dir>/metrics.db and serve /metrics."""
    metrics_port: int | None = None
    """A separate port that serves only /metrics (Triton's 8002); None: /metrics on the HTTP port only."""
    metrics_interval: float = 1.0
    history_raw_hours: float = 24.0
    history_minute_days: float = 7.0
    history_hour_days: float = 90.0
    history_max_bytes: int = 256 * 1024 * 1024
    strict_readiness: bool = True
    """As Triton: the server is ready only when every model is ready."""
    shutdown_timeout: float = 10.0
    """Seconds a stopping daemon waits for in-flight requests: one deadline for the whole stop (requests
    still running then are cancelled; models get a second more to finish and close)."""
    exit_timeout: float = 30.0
    """Triton's --exit-timeout-secs: once the models are closed, seconds the daemon still waits for
    Python model processes that could not close (stuck in execute() or initialize()) before it kills
    them and exits."""
    auth_token: str | None = None
    """Bearer token for control endpoints (and inference when protect_inference); default: the token
    kept in <state_dir>/auth-token, created 0600 on first start."""
    auth_exempt_networks: tuple[str, ...] = ("127.0.0.0/8", "::1/128")
    """Clients in these networks need no token (loopback by default)."""
    trusted_proxies: tuple[str, ...] = ()
    """Reverse proxies (networks) whose X-Forwarded-For names the real client. Off by default: behind
    a local proxy every client would otherwise look like loopback, and loopback needs no token."""
    allowed_hosts: tuple[str, ...] = ()
    """Extra names the box answers to in the Host header (IP literals, localhost, the hostname and its
    mDNS names always work); ".example.com" allows a domain and its subdomains, "*" any name."""
    protect_inference: bool = False
    """Require the token for inference, metadata and metrics too (health stays open)."""
    client_shm: str = "local"
    """Who may use shared memory (register, unregister and status of regions, and inference that names
    one): off (nobody), local (clients on this host: see shm_local_networks) or any (every client
    the other rules admit; regions are still only objects in this host's /dev/shm or GPUs)."""
    shm_local_networks: tuple[str, ...] = ("127.0.0.0/8", "::1/128")
    """Client addresses that count as this host for client_shm = local (besides a client that connects
    from the very address it connects to, which only a process on this host can do)."""
    shm_max_regions: int = 64
    """Shared-memory regions registered at once (system and CUDA together)."""
    shm_max_bytes: int = 2 * 1024**3
    """Bytes of all registered shared-memory regions together."""
    push_max_file_bytes: int = 256 * 1024**2
    """Largest file a push may carry (the load API's ``file:<version>/<name>`` parameters); 413 above. Over
    HTTP a file also travels base64-encoded in a body bounded by max_request_bytes, over gRPC in a
    message bounded by it."""
    push_max_total_bytes: int = 2 * 1024**3
    """Bytes of all pushed models kept together in <state_dir>/pushed (a push replacing a model's files
    does not count the old ones); 413 above."""
    max_concurrent_requests: int = 1024
    """Requests handled at once; beyond it 503 with Retry-After."""
    stream_buffer_bytes: int = 64 * 1024**2
    """Output bytes a decoupled model may send ahead of the client reading them, per request (also at
    most 64 responses, and within max_request_memory_bytes); past it the model's send waits."""
    stream_stall_timeout: float = 60.0
    """Seconds a decoupled model waits for its client to read before the request fails as stalled."""
    max_tensor_elements: int = 1 << 30
    max_inputs: int = 256
    trace_file: str = "trace.json"
    """File name of Triton's trace file, in <state_dir>/traces/ (numbered trace.json.0, .1... with
    log_frequency); the directory is fixed and clients cannot change it."""
    trace_max_bytes: int = 64 * 1024**2
    """Bytes of trace files kept: the oldest numbered files are removed, a single file stops growing."""
    trace_path: str | None = None
    """Triton's ``--trace-config triton,file=<path>``: the trace file at this path instead (relative to the
    daemon's working directory, as Triton's), reported as given."""
    trace_level: tuple[str, ...] = ()
    """Trace settings in force at start (Triton's ``--trace-config level=``, ``rate=``, ``count=``,
    ``triton,log-frequency=``); the trace extension changes them at run time and clearing a global one
    returns it to this. Level: empty or OFF (off), TIMESTAMPS and/or TENSORS."""
    trace_rate: int = 1000
    trace_count: int = -1
    trace_log_frequency: int = 0
    trace_mode: str = "triton"
    """Only Triton's trace files (``triton``) are written here; OpenTelemetry export is not built in."""
    """Input tensors in one request."""
    notify_socket: str | None = None
    """systemd's NOTIFY_SOCKET (taken from the environment systemd sets)."""
    watchdog_usec: int | None = None
    """systemd's WATCHDOG_USEC (taken from the environment systemd sets)."""

    def __post_init__(self) -> None:
        # An absolute path: a relative one would follow whatever directory the process started in.
        object.__setattr__(self, "state_dir", Path(self.state_dir).expanduser().absolute())
        for name in ("http_port", "grpc_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ConfigError(f"{name} must be 0..65535, got {getattr(self, name)}")
        if self.grpc and self.grpc_port == self.http_port != 0:
            raise ConfigError(f"grpc_port and http_port are both {self.http_port}; give gRPC its own port "
                              "(--grpc-port, default 8001) or turn it off (--no-grpc)")
        if self.max_request_bytes < 1024:
            raise ConfigError(f"max_request_bytes must be at least 1024, got {self.max_request_bytes}")
        if self.max_request_memory_bytes < self.max_request_bytes:
            raise ConfigError(
                f"max_request_memory_bytes ({self.max_request_memory_bytes}) must be at least max_request_bytes "
                f"({self.max_request_bytes}): one request of the largest size must fit; raise it or lower "
                "max_request_bytes"
            )
        if self.max_connections < 1:
            raise ConfigError(f"max_connections must be at least 1, got {self.max_connections}")
        for name in ("header_timeout", "body_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.model_control_mode not in ("none", "poll", "explicit"):
            raise ConfigError(
                f"model_control_mode must be none, poll or explicit, got {self.model_control_mode!r}"
            )
        if self.exit_timeout < 0:
            raise ConfigError(f"exit_timeout must be >= 0 seconds, got {self.exit_timeout}")
        if self.repository_poll_secs <= 0:
            raise ConfigError(f"repository_poll_secs must be > 0, got {self.repository_poll_secs}")
        if self.metrics_interval <= 0:
            raise ConfigError(f"metrics_interval must be > 0, got {self.metrics_interval}")
        if self.client_shm not in ("off", "local", "any"):
            raise ConfigError(f"client_shm must be off, local or any, got {self.client_shm!r}")
        for name in ("shm_max_regions", "shm_max_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("auth_exempt_networks", "trusted_proxies", "shm_local_networks"):
            for network in getattr(self, name):
                try:
                    ipaddress.ip_network(network, strict=False)
                except ValueError:
                    raise ConfigError(f"{name}: {network!r} is not a network such as 192.168.1.0/24") from None
        if self.auth_token is not None and len(self.auth_token.strip()) < 16:
            raise ConfigError("auth_token must be at least 16 characters (32 random ones are better)")
        if self.retune_interval <= 0 or self.retune_min_requests < 1:
            raise ConfigError(f"retune_interval must be > 0 and retune_min_requests >= 1, got "
                              f"{self.retune_interval} and {self.retune_min_requests}")
        if not self.trace_file or self.trace_file in (".", "..") or "/" in self.trace_file or "\\" in self.trace_file:
            raise ConfigError(f"trace_file must be a plain file name (it goes in <state_dir>/traces/), got "
                              f"{self.trace_file!r}")
        if self.trace_max_bytes < 4096:
            raise ConfigError(f"trace_max_bytes must be at least 4096, got {self.trace_max_bytes}")
        self._check_trace_defaults()
        if self.stream_buffer_bytes < 1 or not self.stream_stall_timeout > 0:
            raise ConfigError(f"stream_buffer_bytes must be at least 1 and stream_stall_timeout > 0 seconds, got "
                              f"{self.stream_buffer_bytes} and {self.stream_stall_timeout}")
        for name in ("push_max_file_bytes", "push_max_total_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.intra_op_threads < 0:
            raise ConfigError(f"intra_op_threads must be >= 0, got {self.intra_op_threads}")
        if self.event_loop not in ("auto", "uvloop", "asyncio"):
            raise ConfigError(f"event_loop must be auto, uvloop or asyncio, got {self.event_loop!r}")

    def _check_trace_defaults(self) -> None:
        levels = tuple(level.strip().upper() for level in self.trace_level)
        if not set(levels) <= {"OFF", "TIMESTAMPS", "TENSORS"}:
            raise ConfigError(f"trace_level must be OFF, or TIMESTAMPS and/or TENSORS, got {list(self.trace_level)}")
        object.__setattr__(self, "trace_level", () if "OFF" in levels else
                           tuple(level for level in ("TIMESTAMPS", "TENSORS") if level in levels))
        for name, low, high in (("trace_rate", 0, 2**32 - 1), ("trace_count", -1, 2**31 - 1),
                                ("trace_log_frequency", 0, 2**32 - 1)):
            if not low <= getattr(self, name) <= high:
                raise ConfigError(f"{name} must be {low}..{high}, got {getattr(self, name)}")
        if self.trace_mode != "triton":
            raise ConfigError(f"trace_mode {self.trace_mode!r} is not supported: the appliance writes Triton's trace "
                              "files only (trace_mode = triton); OpenTelemetry export is not built in")
        if self.trace_path is not None and (not self.trace_path.strip() or self.trace_path.endswith("/")):
            raise ConfigError(f"trace_path must name a file, got {self.trace_path!r}")

    @property
    def example_repository_dir(self) -> Path:
        return self.state_dir / "example-repository"

    @property
    def cache_dir(self) -> Path:
        return self.state_dir / "cache"

    @property
    def trace_dir(self) -> Path:
        return self.state_dir / "traces"

    @property
    def pushed_dir(self) -> Path:
        """Models pushed over the load API, an overlay of the repository (see core.pushed)."""
        return self.state_dir / "pushed"

    @property
    def metrics_db(self) -> Path:
        return self.state_dir / "metrics.db"


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


def load_settings(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> Settings:
    """Build the settings; ``flags`` holds only options the user gave (None values are ignored)."""
    env = dict(env or {})
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    hints = typing.get_type_hints(Settings)
    names = [f.name for f in dataclasses.fields(Settings)]

    values: dict[str, Any] = {"state_dir": default_state_dir(env)}
    # What systemd hands a service through its environment.
    for name, key in (("notify_socket", "NOTIFY_SOCKET"), ("watchdog_usec", "WATCHDOG_USEC")):
        if env.get(key):
            values[name] = env[key]
    if config_file is None and env.get(ENV_PREFIX + "CONFIG"):
        config_file = Path(env[ENV_PREFIX + "CONFIG"])
    if config_file is not None:
        try:
            document = tomllib.loads(Path(config_file).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read settings file {config_file}: {exc}") from exc
        unknown = sorted(set(document) - set(names))
        if unknown:
            raise ConfigError(
                f"unknown setting(s) {unknown} in {config_file}; known settings: {', '.join(names)}"
            )
        values.update(document)
    for name in names:
        key = ENV_PREFIX + name.upper()
        if key in env:
            values[name] = env[key]
    values.update({k: v for k, v in flags.items() if k in names})
    return Settings(**{k: _convert(k, hints[k], v) for k, v in values.items()})
