"""The settings, one frozen section per concern; each checks its own values (``ConfigError`` naming the
setting and how to fix it) and each component is handed only its section.

Every field has a flat name, its *key*: ``APPLIANCE_<KEY>`` in the environment, ``<key> = ...`` at the
top of the TOML file (or the field's own name inside its section's table, ``[http] port = 8000``), and
``--<key with dashes>`` where the command line has a flag. The key is the field's name unless ``key()``
says otherwise. The docstring under each field is its documentation (``appliance.commands.settings_reference``
reads it for docs/settings.md).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

from appliance.core.errors import ConfigError
from appliance.engine.shared_config import CacheConfig, RedisCacheConfig, ResourceLimit
from appliance.settings.checks import (
    flat_key,
    key,
    require_at_least,
    require_networks,
    require_one_of,
    require_port,
    require_positive,
)
from appliance.tls.context import ServerTls

__all__ = [
    "AuthSection",
    "FleetSection",
    "GrpcSection",
    "HttpSection",
    "LimitsSection",
    "MetricsSection",
    "ModelsSection",
    "PortTls",
    "RateLimiterSection",
    "ResponseCacheSection",
    "SelectionSection",
    "ServerSection",
    "ShmSection",
    "TraceSection",
    "key",
]

LOOPBACK = ("127.0.0.0/8", "::1/128")


class StatePath:
    """A path in the section's ``state_dir``, read as an attribute (``settings.server.cache_dir``)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __get__(self, section: ServerSection, owner: type) -> Path:
        return section.state_dir / self._name


@dataclasses.dataclass(frozen=True, slots=True)
class ServerSection:
    """The daemon itself: where it keeps its files, what it serves, how it logs and stops."""

    state_dir: Path
    """Where the daemon keeps its files (token, cache, metrics, traces, pushed models). ``load_settings``
    resolves it from the flag, the environment or the platform's data directory, never the working
    directory."""
    model_repository: Path | None = None
    """Triton-layout model repository; none serves the built-in example repository."""
    host: str = "0.0.0.0"
    """The address every port binds."""
    log_level: str = "INFO"
    """DEBUG, INFO, WARNING or ERROR, in any case (VERBOSE, Triton's word for its detailed log, is DEBUG)."""
    event_loop: str = "auto"
    """auto (uvloop when installed, else asyncio's), uvloop or asyncio."""
    server_id: str = "triton"
    """The server's name in server metadata (GET /v2 "name"; Triton's --id). Triton's own clients check
    for "triton"."""
    log_format: str = "default"
    """Triton's --log-format: default (local time) or ISO8601 (UTC) time stamps in the log."""
    log_file: str | None = None
    """Triton's --log-file: append the log to this file instead of standard error (the journal)."""
    shutdown_timeout: float = 10.0
    """Seconds a stopping daemon waits for in-flight requests: one deadline for the whole stop (requests
    still running then are cancelled; models get a second more to finish and close)."""
    exit_timeout: float = 30.0
    """Triton's --exit-timeout-secs: once the models are closed, seconds the daemon still waits for Python
    model processes that could not close (stuck in execute() or initialize()) before it kills them."""
    notify_socket: str | None = None
    """systemd's NOTIFY_SOCKET (taken from the environment systemd sets)."""
    watchdog_usec: int | None = None
    """systemd's WATCHDOG_USEC (taken from the environment systemd sets)."""
    probe_cache: bool = True
    """Keep the hardware probe's report and reuse it at the next start while the box has not rebooted and its
    runtimes, accelerator devices and the probe itself are unchanged: a restart then skips seconds of probing
    (ready answers 503 meanwhile). Off: probe at every start."""
    probe_cache_file: Path | None = None
    """Where that report is kept (default <state_dir>/hardware-probe.json); daemons on one box may share one."""

    def __post_init__(self) -> None:
        # An absolute path: a relative one would follow whatever directory the process started in.
        object.__setattr__(self, "state_dir", Path(self.state_dir).expanduser().absolute())
        level = str(self.log_level).upper()
        object.__setattr__(self, "log_level", "DEBUG" if level == "VERBOSE" else level)
        require_one_of(self, "log_level", ("DEBUG", "INFO", "WARNING", "ERROR"))
        require_one_of(self, "event_loop", ("auto", "uvloop", "asyncio"))
        require_one_of(self, "log_format", ("default", "ISO8601"))
        if not self.server_id.strip():
            raise ConfigError("server_id must not be empty (Triton's --id; default triton)")
        require_positive(self, "shutdown_timeout")
        if self.exit_timeout < 0:
            raise ConfigError(f"exit_timeout must be >= 0 seconds, got {self.exit_timeout}")

    example_repository_dir = StatePath("example-repository")
    cache_dir = StatePath("cache")
    trace_dir = StatePath("traces")
    pushed_dir = StatePath("pushed")
    """Models pushed over the load API, an overlay of the repository (see appliance.repository.pushed)."""
    metrics_db = StatePath("metrics.db")


@dataclasses.dataclass(frozen=True, slots=True)
class PortTls:
    """A port's TLS (Triton's --<port>-use-ssl flags), the base of the HTTP and gRPC sections. ``PREFIX``
    begins the keys (``http_use_ssl``) and ``PORT`` names the port in the docs: a ``{prefix}`` or ``{port}``
    in a key or a docstring below stands for them (``flat_key`` and the settings reference fill them in)."""

    PREFIX: ClassVar[str]
    PORT: ClassVar[str]

    use_ssl: bool = key(False, "{prefix}_use_ssl")
    """Serve the {port} port over TLS (Triton's --{prefix}-use-ssl): with {prefix}_server_cert and
    {prefix}_server_key, or the box's own certificate that `appliance tls init` made (<state_dir>/tls/)."""
    server_cert: str | None = key(None, "{prefix}_server_cert")
    """The PEM certificate (chain) the {port} port presents with {prefix}_use_ssl."""
    server_key: str | None = key(None, "{prefix}_server_key")
    """Its PEM private key: readable by the daemon's user alone (chmod 600), or the daemon does not start."""
    root_cert: str | None = key(None, "{prefix}_root_cert")
    """The PEM CA bundle client certificates must chain to, with {prefix}_use_ssl_mutual."""
    use_ssl_mutual: bool = key(False, "{prefix}_use_ssl_mutual")
    """Mutual TLS on the {port} port (TLS on, as with Triton's flag, even without {prefix}_use_ssl): a client
    without a certificate of {prefix}_root_cert's CA is refused in the handshake."""

    def tls(self, state_dir: Path) -> ServerTls | None:
        """The port's TLS as its settings say (None: plain TCP); the box's own certificate by default. Mutual
        TLS turns TLS on by itself, as Triton's --grpc-use-ssl-mutual=true does."""
        flag = f"--{self.PREFIX}"
        if not (self.use_ssl or self.use_ssl_mutual):
            if self.server_cert or self.server_key:
                raise ConfigError(f"{flag}-server-cert and {flag}-server-key take effect with {flag}-use-ssl=true "
                                  f"(or {flag}-use-ssl-mutual=true); add it")
            return None
        if bool(self.server_cert) != bool(self.server_key):
            raise ConfigError(f"{flag}-server-cert and {flag}-server-key go together; give both, or neither to "
                              "serve the box's own certificate (appliance tls init)")
        own = state_dir / "tls"
        cert = Path(self.server_cert).expanduser() if self.server_cert else own / "server.crt"
        private = Path(self.server_key).expanduser() if self.server_key else own / "server.key"
        if not self.server_cert and not cert.exists():
            raise ConfigError(f"{flag}-use-ssl without {flag}-server-cert serves the box's own certificate, and "
                              f"{cert} does not exist: run `appliance tls init` first, or name a certificate and key")
        root = Path(self.root_cert).expanduser() if self.root_cert else None
        return ServerTls(cert, private, root, self.use_ssl_mutual, flag)


@dataclasses.dataclass(frozen=True, slots=True)
class HttpSection(PortTls):
    """The HTTP port; the metrics port shares its connection cap and its TLS."""

    PREFIX = "http"
    PORT = "HTTP"

    port: int = key(8000, "http_port")
    """The HTTP port (Triton's 8000); 0 picks a free one."""
    address: str | None = key(None, "http_address")
    """The address the HTTP port binds (Triton's --http-address); none: host."""
    max_connections: int = 4096
    """Client connections open at once over every port (the gRPC port takes grpc_max_connections of them);
    a connection beyond it gets a short 503 and is closed. Kept below the file-descriptor limit (the
    unit's LimitNOFILE=), with descriptors to spare for health checks, files and SQLite."""
    header_timeout: float = 60.0
    """Seconds a connection may take to send a complete request head, and may stay idle between requests
    (over gRPC: to complete its handshake, and without a call); then it is closed."""
    body_timeout: float = 60.0
    """Seconds a request body may go without a byte arriving (then 408); over gRPC, the time a message may
    take to arrive once its turn to be received has come."""
    allowed_hosts: tuple[str, ...] = ()
    """Extra names the box answers to in the Host header (IP literals, localhost, the hostname and its mDNS
    names always work); ".example.com" allows a domain and its subdomains, "*" any name."""
    trusted_proxies: tuple[str, ...] = ()
    """Reverse proxies (networks) whose X-Forwarded-For names the real client. Off by default: behind a
    local proxy every client would otherwise look like loopback, and loopback needs no token."""
    infer_lane: bool = key(True, "http_infer_lane")
    """Serve small infer requests (up to 64 KiB) on the HTTP port's own lean path instead of through aiohttp
    (same rules and answers, a fraction of the CPU); a connection's first other request hands it to
    aiohttp. Off: aiohttp serves every request."""
    def __post_init__(self) -> None:
        require_port(self, "port")
        require_at_least(self, 1, "max_connections")
        require_positive(self, "header_timeout", "body_timeout")
        require_networks(self, "trusted_proxies")


@dataclasses.dataclass(frozen=True, slots=True)
class GrpcSection(PortTls):
    """The gRPC port: Triton's GRPCInferenceService."""

    PREFIX = "grpc"
    PORT = "gRPC"

    enabled: bool = key(True, "grpc")
    """Serve KServe v2 over gRPC beside HTTP (--no-grpc turns it off)."""
    port: int = key(8001, "grpc_port")
    """The gRPC port (Triton's 8001); 0 picks a free one."""
    address: str | None = key(None, "grpc_address")
    """The address the gRPC port binds (Triton's --grpc-address); none: host."""
    max_connections: int | None = key(None, "grpc_max_connections")
    """Connections the gRPC port takes out of max_connections (the HTTP ports count the rest); default a
    quarter of it."""
    max_streams: int = key(256, "grpc_max_streams")
    """ModelStreamInfer streams open at once (each also counts as a request in max_concurrent_requests)."""
    stream_max_pending: int = key(64, "grpc_stream_max_pending")
    """Requests of one stream read and not yet answered; the stream reads no further until one is (HTTP/2
    flow control then holds the client back)."""
    stream_idle_timeout: float = key(300.0, "grpc_stream_idle_timeout")
    """Seconds a stream with no request in flight may send nothing before it is ended (UNAVAILABLE)."""
    receive_min_rate: int = key(256 * 1024, "grpc_receive_min_rate")
    """Bytes a second a call's message must keep arriving at, after grpc_receive_grace, once the server
    reads it (DEADLINE_EXCEEDED below it): a client that announces a message and stalls loses its receive
    slot."""
    receive_grace: float = key(2.0, "grpc_receive_grace")
    """Seconds a call's message may take before grpc_receive_min_rate applies to it."""
    def __post_init__(self) -> None:
        require_port(self, "port")
        require_at_least(self, 1, "max_streams", "stream_max_pending", "receive_min_rate")
        require_positive(self, "stream_idle_timeout", "receive_grace")
        if self.max_connections is not None:
            require_at_least(self, 1, "max_connections")


@dataclasses.dataclass(frozen=True, slots=True)
class LimitsSection:
    """What one request, and all of them together, may take."""

    max_request_bytes: int = 256 * 1024**2
    """Largest request body accepted, as sent and once decompressed (HTTP 413 above it), and largest gRPC
    message (RESOURCE_EXHAUSTED above it)."""
    max_request_memory_bytes: int = 1024**3
    """Request bytes held in memory at once over all requests and ports: bodies and messages as they
    arrive, decompressed bodies, decoded tensors. Beyond it 503 with Retry-After (gRPC: UNAVAILABLE); at
    least max_request_bytes. gRPC receives at most max_request_memory_bytes // max_request_bytes messages
    at once."""
    max_concurrent_requests: int = 1024
    """Requests handled at once over every port (an open gRPC stream counts as one, and so does every gRPC
    call, ServerLive included; HTTP health checks and scrapes are outside it); beyond it 503 with
    Retry-After (gRPC: UNAVAILABLE)."""
    max_inflation_ratio: int = 200
    """The most a compressed request body or gRPC message may inflate to, as a multiple of its compressed
    size (any may inflate to 1 MiB); beyond it 413 (gRPC: RESOURCE_EXHAUSTED), as a compression bomb. 0:
    no ratio, max_request_bytes alone. Raise it for clients that send large, nearly constant tensors
    compressed."""
    max_tensor_elements: int = 1 << 30
    """Elements of one tensor (checked on the declared shape before anything is allocated)."""
    max_inputs: int = 256
    """Input tensors in one request."""
    stream_buffer_bytes: int = 64 * 1024**2
    """Output bytes a decoupled model may send ahead of the client reading them, per request (also at most
    64 responses, and within max_request_memory_bytes); past it the model's send waits."""
    stream_stall_timeout: float = 60.0
    """Seconds a decoupled model waits for its client to read before the request fails as stalled."""
    request_deadline: float = 0.0
    """Seconds a request to a decoupled model (a stream) and a call of a model to a model (BLS) may take
    from arrival to its final response; past it the request is cancelled (the model sees
    is_cancelled(), a request still queued never runs) and its caller gets DEADLINE_EXCEEDED (HTTP 504).
    0, the default, sets none, as in Triton: a model that never sends its final flag, or one that calls
    itself with a single instance, then holds its request for ever."""

    def __post_init__(self) -> None:
        if not self.request_deadline >= 0:
            raise ConfigError(f"{flat_key(self, 'request_deadline')} must be >= 0 seconds (0: none), got "
                              f"{self.request_deadline}")
        require_at_least(self, 1024, "max_request_bytes")
        if self.max_request_memory_bytes < self.max_request_bytes:
            raise ConfigError(
                f"max_request_memory_bytes ({self.max_request_memory_bytes}) must be at least max_request_bytes "
                f"({self.max_request_bytes}): one request of the largest size must fit; raise it or lower "
                "max_request_bytes"
            )
        require_at_least(self, 1, "max_concurrent_requests", "max_tensor_elements", "max_inputs", "stream_buffer_bytes")
        require_at_least(self, 0, "max_inflation_ratio")
        require_positive(self, "stream_stall_timeout")


@dataclasses.dataclass(frozen=True, slots=True)
class AuthSection:
    """Who needs the bearer token."""

    token: str | None = key(None, "auth_token")
    """Bearer token for control endpoints (and everything but health with protect_inference); default: the
    token kept in <state_dir>/auth-token, created 0600 on first start."""
    exempt_networks: tuple[str, ...] = key(LOOPBACK, "auth_exempt_networks")
    """Clients in these networks need no token (loopback by default)."""
    protect_inference: bool = False
    """Require the token for inference, metadata and metrics too (health stays open)."""

    def __post_init__(self) -> None:
        if self.token is not None and len(self.token.strip()) < 16:
            raise ConfigError("auth_token must be at least 16 characters (32 random ones are better)")
        require_networks(self, "exempt_networks")


@dataclasses.dataclass(frozen=True, slots=True)
class ShmSection:
    """Clients' shared-memory regions."""

    client_shm: str = "local"
    """Who may use shared memory (register, unregister and status of regions, and inference that names
    one): off (nobody), local (clients on this host: see shm_local_networks) or any (every client the
    other rules admit; regions are still only objects in this host's /dev/shm or GPUs)."""
    local_networks: tuple[str, ...] = key(LOOPBACK, "shm_local_networks")
    """Client addresses that count as this host for client_shm = local (besides a client that connects
    from the very address it connects to, which only a process on this host can do)."""
    max_regions: int = key(64, "shm_max_regions")
    """Shared-memory regions registered at once (system and CUDA together)."""
    max_bytes: int = key(2 * 1024**3, "shm_max_bytes")
    """Bytes of all registered shared-memory regions together."""

    def __post_init__(self) -> None:
        require_one_of(self, "client_shm", ("off", "local", "any"))
        require_at_least(self, 1, "max_regions", "max_bytes")
        require_networks(self, "local_networks")


@dataclasses.dataclass(frozen=True, slots=True)
class ModelsSection:
    """The model repository, what is loaded, and how models run."""

    control_mode: str = key("none", "model_control_mode")
    """Triton's: none (load all, no load/unload API), poll (re-scan every repository_poll_secs), explicit
    (load load_models at start; the API loads and unloads)."""
    load_models: tuple[str, ...] = ()
    """Models to load at start in explicit mode ("*" for all)."""
    repository_poll_secs: float = 15.0
    """Poll mode: seconds between two scans of the repository."""
    strict_readiness: bool = True
    """As Triton: the server is ready only when every model is ready."""
    onnx_providers: tuple[str, ...] = ("CPUExecutionProvider",)
    """onnxruntime execution providers to try, in order of preference."""
    intra_op_threads: int = 0
    """Threads each runtime may use inside one operator; 0 lets the runtime decide."""
    push_max_file_bytes: int = 256 * 1024**2
    """Largest file a push may carry (the load API's file:<version>/<name> parameters); 413 above. Over
    HTTP a file also travels base64-encoded in a body bounded by max_request_bytes, over gRPC in a
    message bounded by it."""
    push_max_total_bytes: int = 2 * 1024**3
    """Bytes of all pushed models kept together in <state_dir>/pushed (a push replacing a model's files
    does not count the old ones); 413 above."""
    environment_max_unpacked_bytes: int = 8 * 1024**3
    """Bytes a Python model's packed environment (EXECUTION_ENV_PATH) may unpack to; a larger archive fails
    the model's load, naming this setting."""
    environment_max_members: int = 200_000
    """Files, directories and links a Python model's packed environment may hold; more fail the model's
    load, naming this setting."""
    load_on_demand: bool = False
    """A request for a model the repository has but that is not loaded loads it, then is served (requests
    arriving meanwhile wait for the same load). At start only load_models are loaded (pinned). See
    docs/memory.md."""
    load_on_demand_timeout: float = 120.0
    """Seconds a request waits for its model's load on demand at most (a gRPC request's own ``timeout``
    parameter or deadline may end its wait sooner; docs/memory.md); 503 (retry) after."""
    idle_unload_secs: float = 0.0
    """Unload a model that had no request for this many seconds (its processes end, its memory is
    returned); 0: never. A model's config parameter idle_unload_secs overrides it. Pinned models, models
    with a live sequence or a request in flight, and steps of a loaded ensemble are never unloaded."""
    model_memory_budget_mib: int | None = None
    """MiB the loaded models may hold together: a load first unloads the least recently used idle models
    until its estimate fits; a model larger than the budget is refused (507). None: no budget."""
    memory_pressure_threshold: float = 0.0
    """Unload the least recently used idle model while the kernel's memory pressure (PSI some avg10, in
    percent, /proc/pressure/memory) is at or above this, or the cgroup goes over memory.high; 0: not
    watched."""

    def __post_init__(self) -> None:
        require_at_least(self, 0, "idle_unload_secs", "memory_pressure_threshold")
        require_positive(self, "load_on_demand_timeout")
        if self.model_memory_budget_mib is not None:
            require_at_least(self, 1, "model_memory_budget_mib")
        if self.memory_pressure_threshold > 100:
            raise ConfigError(f"memory_pressure_threshold is a percentage of time stalled (0 to 100), got "
                              f"{self.memory_pressure_threshold:g}")
        require_one_of(self, "control_mode", ("none", "poll", "explicit"))
        require_positive(self, "repository_poll_secs")
        require_at_least(self, 0, "intra_op_threads")
        require_at_least(self, 1, "push_max_file_bytes", "push_max_total_bytes", "environment_max_unpacked_bytes",
                         "environment_max_members")


@dataclasses.dataclass(frozen=True, slots=True)
class SelectionSection:
    """Measuring which plan (runtime, provider, device) runs each model fastest here."""

    enabled: bool = key(True, "selection")
    """Measure the plans of each model and cache the choice (--no-selection serves configs as written)."""
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

    def __post_init__(self) -> None:
        require_positive(self, "tune_budget", "retune_interval")
        require_at_least(self, 1, "retune_min_requests", "cache_max_bytes")


@dataclasses.dataclass(frozen=True, slots=True)
class MetricsSection:
    """On-device history and Prometheus metrics."""

    enabled: bool = key(True, "metrics")
    """Keep on-device history in <state_dir>/metrics.db and serve /metrics (--no-metrics)."""
    port: int | None = key(8002, "metrics_port")
    """The port that serves only /metrics, as Triton's (0 picks a free one); none (metrics_port = "",
    --no-metrics-port): /metrics on the HTTP port only. /metrics is on the HTTP port either way."""
    address: str | None = key(None, "metrics_address")
    """The address the metrics port binds (Triton's --metrics-address); none: the HTTP port's."""
    interval: float = key(1.0, "metrics_interval")
    """Seconds between two samples of the history."""
    history_raw_hours: float = 24.0
    """Hours the history keeps its raw samples."""
    history_minute_days: float = 7.0
    """Days the history keeps its per-minute rollups."""
    history_hour_days: float = 90.0
    """Days the history keeps its per-hour rollups."""
    history_max_bytes: int = 256 * 1024 * 1024
    """Size bound of the history database."""

    def __post_init__(self) -> None:
        if self.port is not None:
            require_port(self, "port")
        require_positive(self, "interval", "history_raw_hours", "history_minute_days", "history_hour_days")
        require_at_least(self, 1, "history_max_bytes")


@dataclasses.dataclass(frozen=True, slots=True)
class TraceSection:
    """Triton's trace extension: where traces go, and the settings in force at start."""

    file: str = key("trace.json", "trace_file")
    """File name of Triton's trace file, in <state_dir>/traces/ (numbered trace.json.0, .1... with
    log_frequency); the directory is fixed and clients cannot change it."""
    max_bytes: int = key(64 * 1024**2, "trace_max_bytes")
    """Disk space trace files may take (counted in the blocks they occupy): the oldest numbered files are
    removed, a single file stops growing."""
    max_files: int = key(1000, "trace_max_files")
    """Trace files kept at once: the oldest numbered files are removed beyond it."""
    path: str | None = key(None, "trace_path")
    """Triton's --trace-config triton,file=<path>: the trace file at this path instead (relative to the
    daemon's working directory, as Triton's), reported as given."""
    level: tuple[str, ...] = key((), "trace_level")
    """Trace settings in force at start (Triton's --trace-config level=, rate=, count=,
    triton,log-frequency=); the trace extension changes them at run time and clearing a global one
    returns it to these. Level: empty or OFF (off), TIMESTAMPS and/or TENSORS."""
    rate: int = key(1000, "trace_rate")
    """Trace the rate-th request, the 2*rate-th... (at start; see trace_level)."""
    count: int = key(-1, "trace_count")
    """Requests to trace, -1 for no limit (at start; see trace_level)."""
    client_rate: int = key(10, "trace_client_rate")
    """With trace_mode = opentelemetry: requests a second, over the daemon, that a client's W3C traceparent
    has traced whatever trace_rate and trace_count (a trace costs about as much CPU as its request, so a
    client must not have every request traced); beyond it such a request is sampled like any other, and
    still continues the caller's trace when sampled. 0: a traceparent never forces a trace."""
    log_frequency: int = key(0, "trace_log_frequency")
    """Traces per numbered trace file, 0 for one file (at start; see trace_level)."""
    mode: str = key("triton", "trace_mode")
    """triton: Triton's trace files; opentelemetry: spans exported over OTLP/HTTP to trace_otel_url (see
    docs/protocol.md, OpenTelemetry)."""
    otel_url: str = key("http://localhost:4318/v1/traces", "trace_otel_url")
    """Where OpenTelemetry spans go (OTLP/HTTP, protobuf), with trace_mode = opentelemetry; a URL without
    a scheme is http (Triton's --trace-config opentelemetry,url=localhost:4318/v1/traces)."""
    otel_resource: tuple[str, ...] = key((), "trace_otel_resource")
    """Resource attributes of the exported spans, each key=value (service.name=triton-inference-server
    unless given; OTEL_RESOURCE_ATTRIBUTES is merged in, as the OpenTelemetry SDK does)."""
    otel_bsp_max_queue_size: int = key(2048, "trace_otel_bsp_max_queue_size")
    """Spans the batch span processor holds before it drops new ones."""
    otel_bsp_schedule_delay: int = key(5000, "trace_otel_bsp_schedule_delay")
    """Milliseconds between two exports of the batch span processor."""
    otel_bsp_max_export_batch_size: int = key(512, "trace_otel_bsp_max_export_batch_size")
    """Spans per export at most (at most trace_otel_bsp_max_queue_size)."""

    def __post_init__(self) -> None:
        if not self.file or self.file in (".", "..") or "/" in self.file or "\\" in self.file:
            raise ConfigError(f"trace_file must be a plain file name (it goes in <state_dir>/traces/), got "
                              f"{self.file!r}")
        require_at_least(self, 4096, "max_bytes")
        require_at_least(self, 1, "max_files")
        levels = tuple(level.strip().upper() for level in self.level)
        if not set(levels) <= {"OFF", "TIMESTAMPS", "TENSORS"}:
            raise ConfigError(f"trace_level must be OFF, or TIMESTAMPS and/or TENSORS, got {list(self.level)}")
        object.__setattr__(self, "level", () if "OFF" in levels else
                           tuple(level for level in ("TIMESTAMPS", "TENSORS") if level in levels))
        for name, low, high in (("rate", 0, 2**32 - 1), ("count", -1, 2**31 - 1), ("log_frequency", 0, 2**32 - 1)):
            if not low <= getattr(self, name) <= high:
                raise ConfigError(f"{flat_key(self, name)} must be {low}..{high}, got {getattr(self, name)}")
        if self.mode not in ("triton", "opentelemetry"):
            raise ConfigError(f'invalid value for trace mode option: {self.mode}. Available options are "triton" '
                              'and "opentelemetry"')
        url = self.otel_url if "://" in self.otel_url else f"http://{self.otel_url}"
        if not url.startswith(("http://", "https://")) or len(url) <= len("http://"):
            raise ConfigError(f"trace_otel_url must be an OTLP/HTTP URL (http://host:4318/v1/traces), got "
                              f"{self.otel_url!r}")
        object.__setattr__(self, "otel_url", url)
        for resource in self.otel_resource:
            if "=" not in resource or not resource.partition("=")[0]:
                raise ConfigError(f"trace_otel_resource entries are key=value, got {resource!r}")
        require_at_least(self, 0, "client_rate")
        require_at_least(self, 1, "otel_bsp_max_queue_size")
        require_at_least(self, 1, "otel_bsp_schedule_delay")
        require_at_least(self, 1, "otel_bsp_max_export_batch_size")
        if self.otel_bsp_max_export_batch_size > self.otel_bsp_max_queue_size:
            raise ConfigError("trace_otel_bsp_max_export_batch_size must be at most trace_otel_bsp_max_queue_size "
                              f"({self.otel_bsp_max_export_batch_size} > {self.otel_bsp_max_queue_size})")
        if self.path is not None and (not self.path.strip() or self.path.endswith("/")):
            raise ConfigError(f"trace_path must name a file, got {self.path!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class FleetSection:
    """The box on the LAN: its mDNS announcement; and, for the fleet commands, the boxes trusted."""

    mdns: bool = True
    """Announce the box on the LAN (_kserve-v2._tcp, _http._tcp) and browse for the others (--no-mdns)."""
    name: str | None = None
    """The box's friendly name on the LAN; default the hostname."""
    mdns_interfaces: tuple[str, ...] = ()
    """IPv4 addresses of the interfaces to announce on; empty means all."""
    trusted_boxes: Path | None = None
    """For the fleet commands: the file of the boxes the operator pinned (``appliance fleet trust``: box id
    and address), the only ones ``appliance push`` acts on and ``appliance fleet`` signs for; default
    <state_dir>/trusted-boxes.json. A box merely found on the LAN is never trusted."""

    def trusted_boxes_file(self, state_dir: Path) -> Path:
        return self.trusted_boxes if self.trusted_boxes is not None else state_dir / "trusted-boxes.json"

    def box_name(self, hostname: str) -> str:
        """The name the box goes by (mDNS, the dashboard): ``name``, else the host's short name."""
        return self.name or hostname.split(".")[0]


@dataclasses.dataclass(frozen=True, slots=True)
class ResponseCacheSection:
    """Triton's response cache, shared by every model whose config enables it (see docs/response-cache.md)."""

    config: tuple[str, ...] = key((), "cache_config")
    """Triton's --cache-config: local,size=<bytes> keeps the responses of models whose config says
    response_cache { enable: true } in memory, under that bound, least recently used out first;
    redis,host=<host> with redis,port=<port> keeps them on a Redis server, shared with every appliance
    that uses it (more settings: docs/response-cache.md); empty: no response cache, whatever the models
    say."""
    redis_user: str | None = key(None, "cache_redis_user")
    """The redis cache's ACL user where cache_config names none (redis,user=... wins); also read from
    Triton's TRITONCACHE_REDIS_USERNAME."""
    redis_password: str | None = dataclasses.field(default=None, repr=False,
                                                   metadata={"key": "cache_redis_password"})
    """The redis cache's password where cache_config names none (redis,password=... wins); also read from
    Triton's TRITONCACHE_REDIS_PASSWORD. An environment variable keeps it out of ps and of the settings file."""
    redis_key: str | None = dataclasses.field(default=None, repr=False, metadata={"key": "cache_redis_key"})
    """The secret (at least 32 characters) that signs the redis cache's entries: an appliance serves an entry
    only when it was signed with its own key, so appliances share their entries only when each is given the
    same one. Without it (or cache_redis_key_file), a box signs with a key of its own, kept in
    <state_dir>/response-cache-key, and reads no other box's entries. An environment variable
    (APPLIANCE_CACHE_REDIS_KEY) keeps it out of ps and of the settings file."""
    redis_key_file: Path | None = key(None, "cache_redis_key_file")
    """A file holding that secret, read at start; its owner alone may read it (chmod 600), as whoever can
    read it can answer for every cached model through Redis."""

    def __post_init__(self) -> None:
        self.parsed  # noqa: B018 - checks the entries
        if self.redis_key is not None and self.redis_key_file is not None:
            raise ConfigError("cache_redis_key and cache_redis_key_file both give the response cache's secret; "
                              "give one of them")
        if self.redis_key is not None and len(self.redis_key.strip()) < 32:
            raise ConfigError("cache_redis_key must be at least 32 characters (e.g. `head -c 32 /dev/urandom | "
                              "base64`): whoever guesses it can answer for every cached model through Redis")

    @property
    def parsed(self) -> CacheConfig | RedisCacheConfig | None:
        """The cache to run (None: none)."""
        return CacheConfig.parse(self.config, self.redis_user, self.redis_password)


@dataclasses.dataclass(frozen=True, slots=True)
class RateLimiterSection:
    """Triton's rate limiter: which model instances may execute at once (see docs/rate-limiter.md)."""

    mode: str = key("off", "rate_limit")
    """Triton's --rate-limit: execution_count runs a model instance only when the resources its instance
    group's rate_limiter names are free, the instance with the fewest executions times its priority first;
    off ignores every rate_limiter."""
    resources: tuple[str, ...] = key((), "rate_limit_resources")
    """Triton's --rate-limit-resource (repeatable): copies of a rate-limiter resource, NAME:COUNT for every
    device or NAME:COUNT:DEVICE for one; empty: the most any loaded instance asks for. Once any is given,
    every resource the models name must be listed with enough copies, or the model fails to load."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", self.mode.strip().lower())
        require_one_of(self, "mode", ("execution_count", "off"))
        self.limits  # noqa: B018 - checks every entry

    @property
    def enabled(self) -> bool:
        return self.mode == "execution_count"

    @property
    def limits(self) -> tuple[ResourceLimit, ...]:
        return tuple(ResourceLimit.parse(entry) for entry in self.resources)
