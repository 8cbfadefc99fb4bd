"""The composition root: ``compose(settings)`` builds every component of the daemon, front-end
configurations included, each handed only its section of the settings; free of any transport.

It checks the state dir, takes the control token, opens the metrics history, finds the model
repository and starts loading it in the background (the hardware probe runs first, in a child
process, while the front ends already answer: what depends on it, the selector and the report, is a
future handed in at construction). ``Appliance.close`` stops all of it in reverse order. REST
(``appliance.rest``) and gRPC (``appliance.grpc``) are front ends the daemon builds from ``rest`` and
``grpc`` over the ``dataplane``: they translate their wire formats and build nothing themselves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import socket
from pathlib import Path

import hardware_probe
from appliance import __version__
from appliance.backends import BackendServices, RuntimeOptions
from appliance.backends.children import ChildProcesses
from appliance.backends.python.wire.arena import arena_usage, remove_stale_arenas
from appliance.core.errors import ConfigError
from appliance.engine.rate_limiter import RateLimiter
from appliance.engine.response_cache import ResponseCache, ResponseStore
from appliance.engine.scheduler.execution import measure_thread_hop
from appliance.engine.server_wide import ServerWide
from appliance.engine.shared_config import RedisCacheConfig
from appliance.engine.streaming import StreamLimits
from appliance.engine.tensor_checks import DecodeLimits
from appliance.examples import ensure_example_repository, example_repository
from appliance.grpc.grpc_config import GrpcConfig, StreamRules
from appliance.mdns.identity import box_id
from appliance.metrics.custom import CustomMetrics
from appliance.metrics.service import MetricsService
from appliance.metrics.store import Retention
from appliance.protocol.admission import AccessPolicy, Admission, parse_networks
from appliance.protocol.dataplane import DataPlane, Rules
from appliance.protocol.log_settings import LogSettings, LogValues
from appliance.protocol.shared_memory import LocalPeers, SharedMemoryLimits, SharedMemoryRegistry
from appliance.protocol.trace_settings import TraceSettings, TraceValues
from appliance.protocol.trace_writer import TraceWriter
from appliance.protocol.tracing import Tracer
from appliance.repository.plan_choice import PlanChooser
from appliance.repository.pushed import PushLimits, PushStore
from appliance.repository.registry import ModelRegistry
from appliance.repository.residency import ResidencyRules
from appliance.repository.retune import RetunePolicy, Retuner
from appliance.rest.rest_config import BodyLimits, RestConfig, host_policy
from appliance.runtime.lifecycle import Lifecycle
from appliance.runtime.state import StateDir
from appliance.runtime.state_lock import StateLock
from appliance.security.budget import MemoryBudget
from appliance.security.fleet_signature import FleetVerifier
from appliance.security.token import control_token
from appliance.selection import Selector
from appliance.selection.selector import Hardware, SelectionSettings, open_cache
from appliance.settings import Settings, sections
from appliance.tls.context import ServerTls
from hardware_probe import ProbeReport
from model_cache.environments import UnpackLimits

__all__ = ["Appliance", "compose", "make_selector", "probe_cache_file", "resolve_repository", "runtime_options",
           "server_wide",
           "split_connections"]

log = logging.getLogger(__name__)


# What models get to finish and close when the appliance stops. The front ends have stopped by then:
# every request finished or was cancelled at the shutdown deadline, so what is left is at most a batch
# that a cancelled request left running in a runtime; waiting a second shutdown_timeout for it would
# double the stop.
CLOSE_GRACE = 1.0


def runtime_options(models: sections.ModelsSection) -> RuntimeOptions:
    return RuntimeOptions(onnx_providers=models.onnx_providers, intra_op_threads=models.intra_op_threads)


def residency_rules(models: sections.ModelsSection, server: sections.ServerSection,
                    state: StateDir) -> ResidencyRules:
    """Load on demand, idle unload, the memory budget and pressure; measurements kept in the state dir."""
    budget = models.model_memory_budget_mib
    return ResidencyRules(load_on_demand=models.load_on_demand, load_timeout=models.load_on_demand_timeout,
                          idle_unload_secs=models.idle_unload_secs,
                          budget_bytes=budget * 1024 * 1024 if budget is not None else None,
                          pressure_threshold=models.memory_pressure_threshold,
                          book=server.state_dir / "model-memory.json" if state.writable else None)


def resolve_repository(server: sections.ServerSection) -> Path:
    """The repository to serve: the configured one, else the built-in example (generated once)."""
    if server.model_repository is not None:
        return server.model_repository
    return ensure_example_repository(server.example_repository_dir)


def make_selector(section: sections.SelectionSection, server: sections.ServerSection, report: ProbeReport,
                  isolate: bool = False, state: StateDir | None = None) -> Selector | None:
    """``isolate``: measure candidates in a child process (the daemon), not in this one (the CLI).
    ``state``: the daemon's checked state dir (checked here for the CLI)."""
    if not section.enabled:
        return None
    state = state or StateDir.check(server.state_dir)
    return Selector(
        Hardware.of(report),
        open_cache(server.cache_dir, section.cache_max_bytes, state),
        SelectionSettings(budget=section.tune_budget),
        isolate=isolate,
        state=state,
    )



def split_connections(http: sections.HttpSection, grpc: sections.GrpcSection, total: int) -> tuple[int, int]:
    """max_connections (``total``: fitted under the descriptor limit) as (HTTP and metrics ports, gRPC
    port): gRPC multiplexes its calls on few connections, so a share of the bound is its own (a quarter
    unless grpc_max_connections says); a flood of idle connections to one port never locks the other out."""
    if not grpc.enabled or total < 2:
        return total, 0
    wanted = grpc.max_connections or max(1, http.max_connections // 4)
    share = max(1, min(total - 1, wanted * total // http.max_connections))
    return total - share, share


def rest_config(http: sections.HttpSection, limits: sections.LimitsSection, metrics: sections.MetricsSection,
                server: sections.ServerSection, box_name: str | None, state: StateDir,
                tls: ServerTls | None = None) -> RestConfig:
    return RestConfig(
        tls=tls,
        body=BodyLimits(limits.max_request_bytes, http.body_timeout, limits.max_inflation_ratio),
        hosts=host_policy(http.allowed_hosts, box_name),
        trusted_proxies=parse_networks(http.trusted_proxies),
        history=server.metrics_db if metrics.enabled else None,
        history_read_only=not state.writable,
    )


def _checked_tls(tls: ServerTls | None) -> ServerTls | None:
    """A port's TLS, checked before anything binds (ConfigError with the fix: a key others can read...)."""
    if tls is not None:
        tls.check()
    return tls


def grpc_config(grpc: sections.GrpcSection, limits: sections.LimitsSection, http: sections.HttpSection,
                connections: int, tls: ServerTls | None = None) -> GrpcConfig:
    return GrpcConfig(
        tls=tls,
        max_message_bytes=limits.max_request_bytes,
        receivers=max(1, limits.max_request_memory_bytes // limits.max_request_bytes),
        receive_timeout=http.body_timeout,
        receive_min_rate=grpc.receive_min_rate,
        receive_grace=grpc.receive_grace,
        max_inflation_ratio=limits.max_inflation_ratio,
        max_connections=connections,
        max_streams=grpc.max_streams,
        max_streams_per_connection=limits.max_concurrent_requests,
        idle_timeout=http.header_timeout,
        stream=StreamRules(grpc.stream_max_pending, grpc.stream_idle_timeout),
    )


def _retention(metrics: sections.MetricsSection) -> Retention:
    return Retention(
        raw_seconds=int(metrics.history_raw_hours * 3600),
        minute_seconds=int(metrics.history_minute_days * 86400),
        hour_seconds=int(metrics.history_hour_days * 86400),
        max_bytes=metrics.history_max_bytes,
    )


def _stream_limits(limits: sections.LimitsSection) -> StreamLimits:
    """One for every stream: the clients' (the data plane's rules) and the models' own calls (BLS)."""
    return StreamLimits(max_bytes=limits.stream_buffer_bytes, stall_timeout=limits.stream_stall_timeout,
                        deadline=limits.request_deadline)


def _rules(models: sections.ModelsSection, limits: sections.LimitsSection, fleet: sections.FleetSection,
           server_id: str = "triton") -> Rules:
    host = socket.gethostname()
    return Rules(control_mode=models.control_mode, strict_readiness=models.strict_readiness,
                 decode=DecodeLimits(limits.max_tensor_elements, limits.max_inputs), streams=_stream_limits(limits),
                 box_name=fleet.box_name(host), host=host, server_id=server_id)


@dataclasses.dataclass(eq=False)
class Appliance:
    """A started appliance; made by ``compose`` only."""

    settings: Settings
    state: StateDir
    """The state dir as checked at start: what is degraded, and why."""
    token: str
    """The control token every front end's admission checks."""
    box_id: str
    """This box's stable id (<state_dir>/device-id), announced on the LAN and bound into signed requests."""
    metrics: MetricsService | None
    shared_memory: SharedMemoryRegistry
    """Clients' shared-memory regions, unregistered (closed) at stop."""
    registry: ModelRegistry
    dataplane: DataPlane
    """The one way in for every front end."""
    traces: TraceSettings
    """Triton's trace settings, global and per model; traces go to <state_dir>/traces/."""
    tracer: Tracer
    """Samples requests for Triton's trace extension and hands them to the trace writer."""
    hardware: asyncio.Future[dict]
    """The hardware probe's report (JSON), once the start-up probe has run."""
    rest: RestConfig
    """The REST front end's configuration (the HTTP port; the metrics port takes the same rules)."""
    grpc: GrpcConfig | None
    """The gRPC front end's configuration; None with --no-grpc."""
    http_connections: int
    """Connections the HTTP and metrics ports may hold together (the rest of max_connections is gRPC's)."""
    _lifecycle: Lifecycle

    async def close(self) -> list[BaseException]:
        """Stop everything in reverse order of start; the errors met on the way (each logged)."""
        return await self._lifecycle.close()


async def server_wide(cache: sections.ResponseCacheSection, limiter: sections.RateLimiterSection,
                      lifecycle: Lifecycle, state: StateDir, budget: MemoryBudget) -> ServerWide:
    """The response cache (``cache_config``) and the rate limiter (``rate_limit``) the models share. ``budget``:
    the request memory budget, which the redis cache's reads are counted against."""
    if limiter.resources and not limiter.enabled:
        log.warning("rate_limit_resources are ignored while rate_limit is off; start with --rate-limit "
                    "execution_count to limit model instances by them")
    config = cache.parsed
    store: ResponseStore | None = None
    if isinstance(config, RedisCacheConfig):
        # Imported here: redis (with what it loads, ~19 MiB) stays out of a daemon that does not use it.
        from appliance.engine.redis_cache import RedisResponseCache
        from appliance.engine.redis_entry import entry_keys

        keys = await asyncio.to_thread(entry_keys, cache.redis_key, cache.redis_key_file, state.path, state.note)
        redis = RedisResponseCache(config, keys, budget)
        lifecycle.on_close("the redis response cache", redis.close)  # closed after the models that write to it
        await redis.check()  # refused credentials stop the start; a Redis that is down does not
        store = redis
    elif config is not None:
        store = ResponseCache(config.size)
    return ServerWide(
        response_cache=store,
        rate_limiter=RateLimiter(limiter.limits) if limiter.enabled else None,
    )


async def compose(settings: Settings, connections: int | None = None) -> Appliance:
    """Build and start every component in order; if one fails, those already started are stopped again.
    ``connections``: max_connections as fitted under the descriptor limit (default: as set)."""
    lifecycle = Lifecycle()
    try:
        return await _compose(settings, lifecycle, connections or settings.http.max_connections)
    except BaseException:
        await lifecycle.close()
        raise


async def _compose(settings: Settings, lifecycle: Lifecycle, connections: int) -> Appliance:
    server = settings.server
    # TLS first: a certificate that cannot be used, or a key others can read, stops the start at once.
    http_tls = _checked_tls(settings.http.tls(server.state_dir))
    grpc_tls = _checked_tls(settings.grpc.tls(server.state_dir)) if settings.grpc.enabled else None
    # Checked once, before anything reads or writes there: a read-only or damaged state dir degrades the
    # appliance (and says so), it never stops it.
    state = await asyncio.to_thread(StateDir.check, server.state_dir)
    if state.writable:  # one daemon per state dir: a second one stops here, naming the first one's PID
        held = await asyncio.to_thread(StateLock.acquire, server.state_dir)
        if held is not None:
            lifecycle.on_close("the state dir lock", lambda: _call(held.release))
    stale = await asyncio.to_thread(remove_stale_arenas)
    if stale:
        log.info("removed %d shared-memory arenas left by model processes that died", len(stale))
    token = await asyncio.to_thread(control_token, settings.auth, server.state_dir, state)
    own_id = await asyncio.to_thread(box_id, server.state_dir, state)
    registries: list[ModelRegistry] = []  # the metrics start first, to see the models load
    custom_metrics = CustomMetrics() if settings.metrics.enabled else None
    children = ChildProcesses()
    budget = MemoryBudget(settings.limits.max_request_memory_bytes)
    shared = await server_wide(settings.response_cache, settings.rate_limiter, lifecycle, state, budget)
    metrics = await _start_metrics(settings.metrics, server, state, registries, lifecycle, custom_metrics, children,
                                   shared)
    shm = settings.shm
    shared_memory = SharedMemoryRegistry(shm.client_shm, SharedMemoryLimits(shm.max_regions, shm.max_bytes),
                                         LocalPeers(shm.local_networks))
    lifecycle.on_close("the shared memory regions", lambda: _call(shared_memory.close))
    repository, scratch = await asyncio.to_thread(_repository, server, state)
    if scratch is not None:
        lifecycle.on_close("the temporary example repository", lambda: asyncio.to_thread(shutil.rmtree, scratch, True))
    # Closed after the models (below): what is left then are model processes stuck in a call.
    lifecycle.on_close("the model processes", lambda: _end_children(children, server.exit_timeout))
    pushed, pushes = await asyncio.to_thread(_open_pushes, settings.models, server, state)
    hop = await measure_thread_hop()
    log.info("thread hop (event loop -> instance thread -> event loop): %.0f µs", hop / 1000)
    loop = asyncio.get_running_loop()
    selector: asyncio.Future[PlanChooser | None] = loop.create_future()
    hardware: asyncio.Future[dict] = loop.create_future()
    registry = ModelRegistry(
        repository,
        dataclasses.replace(runtime_options(settings.models), thread_hop_ns=hop),
        selector=selector,
        retune=settings.selection.retune,
        drain_timeout=server.shutdown_timeout,
        on_event=metrics.event if metrics is not None else None,
        services=BackendServices(metrics=custom_metrics, processes=children,
                                 environments=server.cache_dir / "environments",
                                 environment_limits=UnpackLimits(settings.models.environment_max_unpacked_bytes,
                                                                 settings.models.environment_max_members)),
        control_mode=settings.models.control_mode,
        overlay=pushed.model_dirs if pushed is not None else None,
        pushes=pushes,
        call_limits=_stream_limits(settings.limits),
        server=shared,
        residency=residency_rules(settings.models, server, state),
    )
    try:
        await asyncio.to_thread(registry.discover)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from exc
    registries.append(registry)
    lifecycle.on_close("the models", lambda: _close_models(registry))
    traces, tracer = _start_tracing(settings, state, lifecycle)
    logs = LogSettings(logging.getLogger(),
                       dataclasses.replace(LogValues.from_level(server.log_level), log_format=server.log_format),
                       server.log_file or "")
    lifecycle.on_close("the log settings", lambda: _call(logs.restore))
    limits = settings.limits
    admission = Admission(AccessPolicy(token, parse_networks(settings.auth.exempt_networks),
                                       settings.auth.protect_inference, FleetVerifier(token, own_id)),
                          limits.max_concurrent_requests)
    dataplane = DataPlane(registry, _rules(settings.models, limits, settings.fleet, server.server_id),
                          admission=admission, budget=budget, shared_memory=shared_memory,
                          tracer=tracer, traces=traces, logs=logs, pushes=pushes, state=state, hardware=hardware)
    http_connections, grpc_connections = split_connections(settings.http, settings.grpc, connections)
    appliance = Appliance(
        settings, state, token, own_id, metrics, shared_memory, registry, dataplane, traces, tracer, hardware,
        rest_config(settings.http, limits, settings.metrics, server, settings.fleet.name, state, http_tls),
        grpc_config(settings.grpc, limits, settings.http, grpc_connections, grpc_tls)
        if settings.grpc.enabled else None,
        http_connections, lifecycle,
    )
    log.info("loading model repository %s", repository)
    task = asyncio.create_task(_load_repository(appliance, selector), name="load-repository")
    task.add_done_callback(lambda done: _loading_ended(dataplane, done))
    lifecycle.on_close("loading the repository", lambda: _cancel(task))
    if registry.residency.active:
        watching = asyncio.create_task(registry.residency.run(), name="model-residency")
        lifecycle.on_close("the model residency watcher", lambda: _cancel(watching))
    if settings.selection.enabled and settings.selection.retune_on_traffic:
        retuner = Retuner(registry, RetunePolicy(settings.selection.retune_interval,
                                                 settings.selection.retune_min_requests))
        retuning = asyncio.create_task(retuner.run(dataplane.wait_loaded), name="retune-on-traffic")
        lifecycle.on_close("retuning on traffic", lambda: _cancel(retuning))
    return appliance


async def _call(function) -> None:
    function()


async def _start_metrics(section: sections.MetricsSection, server: sections.ServerSection, state: StateDir,
                         registries: list[ModelRegistry], lifecycle: Lifecycle,
                         custom: CustomMetrics | None, children: ChildProcesses,
                         shared: ServerWide) -> MetricsService | None:
    if not section.enabled:
        return None
    service = MetricsService(
        server.metrics_db, _retention(section), section.interval,
        lambda: registries[0].ready_versions() if registries else [], state, custom=custom,
        arenas=lambda: arena_usage({os.getpid(), *children.pids()}), server=shared,
        residency=lambda: registries[0].residency.status() if registries and registries[0].residency.active else None,
    )
    await service.start()
    service.event("daemon_start", detail={"version": __version__})

    async def stop() -> None:
        service.event("daemon_stop")
        await service.stop()

    lifecycle.on_close("the metrics history", stop)
    return service


def _start_tracing(settings: Settings, state: StateDir, lifecycle: Lifecycle) -> tuple[TraceSettings, Tracer]:
    """Traces go to files under the state dir (or where trace_path says); a read-only directory keeps them
    in memory (bounded)."""
    server, section = settings.server, settings.trace
    # A read-only state dir is reported once (its read_only problem says traces stay in memory).
    where = Path(section.path).parent if section.path is not None else server.state_dir
    fix = f"make {where} writable, then restart the daemon"

    def failed(reason: str) -> None:
        state.note("traces", f"{reason}: traces are kept in memory only", fix)

    if section.path is not None:  # Triton's --trace-config triton,file=<path>: where the operator said
        path = Path(section.path).expanduser().absolute()
        directory: Path | None = path.parent
        name, reported = path.name, section.path
    else:
        directory = server.trace_dir if state.writable else None
        name, reported = section.file, str(server.trace_dir / section.file)
    writer = TraceWriter(directory, name, section.max_bytes, on_error=failed, max_files=section.max_files)
    lifecycle.on_close("the trace writer", lambda: asyncio.to_thread(writer.close))
    exporter = None
    if section.mode == "opentelemetry":  # spans over OTLP/HTTP instead of the files
        # Imported here: the OpenTelemetry SDK stays out of a daemon that writes Triton's trace files.
        from appliance.protocol.trace_otel import OtelExporter

        exporter = OtelExporter(section.otel_url, section.otel_resource,
                                max_queue_size=section.otel_bsp_max_queue_size,
                                schedule_delay_ms=section.otel_bsp_schedule_delay,
                                max_export_batch_size=section.otel_bsp_max_export_batch_size)
        lifecycle.on_close("the OpenTelemetry exporter", lambda: asyncio.to_thread(exporter.close))
        log.info("traces are exported as OpenTelemetry spans to %s", section.otel_url)
    defaults = TraceValues(section.level, section.rate, section.count, section.log_frequency)
    traces = TraceSettings(defaults, trace_file=reported, mode=section.mode)
    return traces, Tracer(traces, writer, exporter, client_rate=section.client_rate)


def _open_pushes(models: sections.ModelsSection, server: sections.ServerSection,
                 state: StateDir) -> tuple[PushStore | None, PushStore | None]:
    """The models pushed over the load API in earlier runs: (the store serving them, the store taking new
    pushes). A read-only state dir still serves what was pushed before, and takes no new push."""
    store = PushStore(server.pushed_dir, PushLimits(models.push_max_file_bytes, models.push_max_total_bytes))
    try:
        pushed = store.open()
    except OSError as exc:
        state.note("pushed_models_unreadable",
                   f"the pushed models in {server.pushed_dir} cannot be read ({exc.strerror or exc}): they are "
                   "not served, and pushes are refused", f"make {server.pushed_dir} readable and writable")
        return None, None
    if pushed:
        log.info("pushed models kept from earlier runs: %s", ", ".join(sorted(pushed)))
    return store, store if state.writable else None


def _repository(server: sections.ServerSection, state: StateDir) -> tuple[Path, Path | None]:
    """The repository, and a temporary directory to remove at stop (where the example went)."""
    if server.model_repository is not None:
        return server.model_repository, None
    return example_repository(server.example_repository_dir, state)


async def _end_children(children: ChildProcesses, exit_timeout: float) -> None:
    if not children.alive():
        return
    log.info("waiting up to %.0f s (exit_timeout) for model processes still busy", exit_timeout)
    killed = await asyncio.to_thread(children.stop, exit_timeout)
    if killed:
        log.warning("killed the processes of models %s: still busy after exit_timeout", ", ".join(killed))


async def _close_models(registry: ModelRegistry) -> None:
    errors = await registry.close(CLOSE_GRACE)
    for error in errors:
        log.error("error while closing a model: %s", error)


def probe_cache_file(server: sections.ServerSection, state: StateDir) -> Path | None:
    """Where the daemon (and ``appliance tune``, so that both compute the same fingerprint) keeps its probe
    report; None: probe every time (probe_cache off, or a state dir that takes no writes)."""
    if not server.probe_cache:
        return None
    if server.probe_cache_file is not None:
        return Path(server.probe_cache_file)
    return server.state_dir / "hardware-probe.json" if state.writable else None


async def _load_repository(appliance: Appliance, selector: asyncio.Future[PlanChooser | None]) -> None:
    settings, registry, dataplane = appliance.settings, appliance.registry, appliance.dataplane
    # Probing imports the runtimes (seconds): done with the front ends already answering, and in a child
    # process, so that a daemon serving only ONNX never holds torch or OpenVINO.
    kept = probe_cache_file(settings.server, appliance.state)
    log.info("probing this box's hardware and runtimes (%s; ready answers 503 until the models load)",
             f"a report kept in {kept} serves while the box and its runtimes are the same" if kept is not None
             else f"up to {hardware_probe.DEFAULT_TIMEOUT:.0f} s")
    try:
        report, reused = await asyncio.to_thread(hardware_probe.probe_cached, kept)
    except BaseException:
        selector.set_result(None)  # loads waiting for a plan go on with their configs' backends
        raise
    appliance.hardware.set_result({**report.to_json(), "summary": report.summary()})
    log.info("hardware%s: %s", " (kept report: same boot, runtimes and devices)" if reused else "", report.summary())
    for runtime, reason in report.runtime_absences().items():
        log.info("hardware: %s is absent: %s", runtime, reason)
    if appliance.metrics is not None:
        appliance.metrics.event("hardware", detail={"fingerprint": report.fingerprint, "summary": report.summary()})
    selector.set_result(make_selector(settings.selection, settings.server, report, isolate=True,
                                      state=appliance.state))
    models = settings.models
    explicit = (models.control_mode == "explicit" or models.load_on_demand) and "*" not in models.load_models
    # Pushed models were loaded by a request: they serve again after a restart, in every mode.
    names = (*models.load_models, *registry.pushed_names()) if explicit else None
    log.info("loading %s of the repository's %d models%s", "all" if names is None else len(set(names)),
             len(registry.entries()), " (a model the cache has no plan for is measured first: tuning)"
             if settings.selection.enabled else "")
    registry.residency.pin(models.load_models if explicit else ())
    await registry.load_all(names)
    registry.residency.mark_not_loaded()
    dataplane.mark_loaded()
    log.info("repository loaded: %d of %d models ready", registry.ready_count(), len(registry.entries()))
    if models.control_mode == "poll":
        while True:
            await asyncio.sleep(models.repository_poll_secs)
            changes = await registry.rescan()
            if any(changes.values()):
                log.info("repository poll: %s", changes)


def _loading_ended(dataplane: DataPlane, task: asyncio.Task) -> None:
    """A load task that died leaves models LOADING for ever: say why at once and stop being live, so that
    a supervisor (systemd's watchdog, a Kubernetes liveness probe) restarts the daemon."""
    if task.cancelled() or task.exception() is None:
        return
    exc = task.exception()
    assert exc is not None
    reason = f"loading the model repository failed: {type(exc).__name__}: {exc}"
    log.error("%s; the daemon reports itself not live", reason, exc_info=exc)
    dataplane.fail(reason)


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    except Exception:  # noqa: BLE001 - reported by _loading_ended already
        pass
