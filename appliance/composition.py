"""The composition root: every resource of the daemon, made from ``Settings``, free of any transport.

``Appliance.start`` checks the state dir, takes the control token, opens the metrics history, finds
the model repository and starts loading it in the background (the hardware probe runs first, in a
child process, while the front ends already answer); ``close`` stops all of it in reverse order. REST
(``appliance.rest``) and gRPC (``appliance.grpc``) are front ends handed the started appliance: they
translate their wire formats to calls on its ``dataplane`` and build nothing themselves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
from pathlib import Path

import hardware_probe
from appliance import __version__
from appliance.backends import BackendServices, RuntimeOptions
from appliance.backends.children import ChildProcesses
from appliance.backends.python.arena import remove_stale_arenas
from appliance.budget import MemoryBudget
from appliance.engine.scheduler.execution import measure_thread_hop
from appliance.engine.streaming import StreamLimits
from appliance.engine.tensor_checks import DecodeLimits
from appliance.errors import ConfigError
from appliance.examples import ensure_example_repository, example_repository
from appliance.grpc.config import GrpcConfig, StreamRules
from appliance.lifecycle import Lifecycle
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
from appliance.repository.pushed import PushLimits, PushStore
from appliance.repository.registry import ModelRegistry
from appliance.repository.retune import RetunePolicy, Retuner
from appliance.rest.config import BodyLimits, RestConfig, host_policy
from appliance.selection import Selector
from appliance.selection.selector import Hardware, SelectionSettings, open_cache
from appliance.settings import Settings
from appliance.state import StateDir
from appliance.token import control_token
from hardware_probe import ProbeReport

__all__ = ["Appliance", "grpc_config", "make_selector", "resolve_repository", "rest_config", "runtime_options",
           "split_connections"]

log = logging.getLogger(__name__)

# What models get to finish and close when the appliance stops. The front ends have stopped by then:
# every request finished or was cancelled at the shutdown deadline, so what is left is at most a batch
# that a cancelled request left running in a runtime; waiting a second shutdown_timeout for it would
# double the stop.
CLOSE_GRACE = 1.0


def runtime_options(settings: Settings) -> RuntimeOptions:
    return RuntimeOptions(onnx_providers=settings.onnx_providers, intra_op_threads=settings.intra_op_threads)


def resolve_repository(settings: Settings) -> Path:
    """The repository to serve: the configured one, else the built-in example (generated once)."""
    if settings.model_repository is not None:
        return settings.model_repository
    return ensure_example_repository(settings.example_repository_dir)


def make_selector(settings: Settings, report: ProbeReport, isolate: bool = False,
                  state: StateDir | None = None) -> Selector | None:
    """``isolate``: measure candidates in a child process (the daemon), not in this one (the CLI).
    ``state``: the daemon's checked state dir (checked here for the CLI)."""
    if not settings.selection:
        return None
    state = state or StateDir.check(settings.state_dir)
    return Selector(
        Hardware.of(report),
        open_cache(settings.cache_dir, settings.cache_max_bytes, state),
        SelectionSettings(budget=settings.tune_budget),
        isolate=isolate,
        state=state,
    )


def rest_config(settings: Settings, state: StateDir) -> RestConfig:
    return RestConfig(
        body=BodyLimits(settings.max_request_bytes, settings.body_timeout),
        hosts=host_policy(settings.allowed_hosts, settings.name),
        trusted_proxies=parse_networks(settings.trusted_proxies),
        history=settings.metrics_db if settings.metrics else None,
        history_read_only=not state.writable,
    )


def split_connections(total: int, grpc: bool) -> tuple[int, int]:
    """max_connections (fitted under the descriptor limit) as (HTTP and metrics ports, gRPC port): gRPC
    multiplexes its calls on few connections, so a quarter of the bound is its own; a flood of idle
    connections to one port then never locks the other out."""
    if not grpc or total < 2:
        return total, 0
    share = max(1, total // 4)
    return total - share, share


def grpc_config(settings: Settings, connections: int) -> GrpcConfig:
    return GrpcConfig(
        max_message_bytes=settings.max_request_bytes,
        receivers=max(1, settings.max_request_memory_bytes // settings.max_request_bytes),
        receive_timeout=settings.body_timeout,
        max_connections=connections,
        max_streams=settings.max_concurrent_requests,
        max_streams_per_connection=settings.max_concurrent_requests,
        idle_timeout=settings.header_timeout,
        stream=StreamRules(),
    )


def _retention(settings: Settings) -> Retention:
    return Retention(
        raw_seconds=int(settings.history_raw_hours * 3600),
        minute_seconds=int(settings.history_minute_days * 86400),
        hour_seconds=int(settings.history_hour_days * 86400),
        max_bytes=settings.history_max_bytes,
    )


@dataclasses.dataclass(eq=False)
class Appliance:
    """A started appliance; made by ``Appliance.start`` only."""

    settings: Settings
    state: StateDir
    """The state dir as checked at start: what is degraded, and why."""
    token: str
    """The control token every front end checks."""
    budget: MemoryBudget
    """Request bytes in memory, over every request of every front end."""
    metrics: MetricsService | None
    shared_memory: SharedMemoryRegistry
    """Clients' shared-memory regions, unregistered (closed) at stop."""
    registry: ModelRegistry
    dataplane: DataPlane
    traces: TraceSettings
    """Triton's trace settings, global and per model; traces go to <state_dir>/traces/."""
    logs: LogSettings
    """Triton's log settings, applied to this process's logging when changed."""
    hardware: asyncio.Future[dict]
    """The hardware probe's report (JSON), once the start-up probe has run."""
    tracer: Tracer
    """Samples requests for Triton's trace extension and hands them to the trace writer."""
    _lifecycle: Lifecycle

    @classmethod
    async def start(cls, settings: Settings) -> Appliance:
        """Start every resource in order; if one fails, those already started are stopped again."""
        lifecycle = Lifecycle()
        try:
            return await cls._start(settings, lifecycle)
        except BaseException:
            await lifecycle.close()
            raise

    @classmethod
    async def _start(cls, settings: Settings, lifecycle: Lifecycle) -> Appliance:
        # Checked once, before anything reads or writes there: a read-only or damaged state dir
        # degrades the appliance (and says so), it never stops it.
        state = await asyncio.to_thread(StateDir.check, settings.state_dir)
        stale = await asyncio.to_thread(remove_stale_arenas)
        if stale:
            log.info("removed %d shared-memory arenas left by model processes that died", len(stale))
        token = await asyncio.to_thread(control_token, settings, state)
        registries: list[ModelRegistry] = []  # the metrics start first, to see the models load
        custom_metrics = CustomMetrics() if settings.metrics else None
        metrics = await cls._start_metrics(settings, state, registries, lifecycle, custom_metrics)
        shared_memory = SharedMemoryRegistry(
            settings.client_shm,
            SharedMemoryLimits(settings.shm_max_regions, settings.shm_max_bytes),
            LocalPeers(settings.shm_local_networks),
        )

        async def close_shared_memory() -> None:
            shared_memory.close()

        lifecycle.on_close("the shared memory regions", close_shared_memory)
        repository, scratch = await asyncio.to_thread(cls._repository, settings, state)
        if scratch is not None:
            lifecycle.on_close("the temporary example repository",
                               lambda: asyncio.to_thread(shutil.rmtree, scratch, True))
        children = ChildProcesses()
        # Closed after the models (below): what is left then are model processes stuck in a call.
        lifecycle.on_close("the model processes", lambda: cls._end_children(children, settings.exit_timeout))
        pushed, pushes = await asyncio.to_thread(cls._open_pushes, settings, state)
        hop = await measure_thread_hop()
        log.info("thread hop (event loop -> instance thread -> event loop): %.0f µs", hop / 1000)
        registry = ModelRegistry(
            repository,
            dataclasses.replace(runtime_options(settings), thread_hop_ns=hop),
            retune=settings.retune,
            drain_timeout=settings.shutdown_timeout,
            on_event=metrics.event if metrics is not None else None,
            services=BackendServices(metrics=custom_metrics, processes=children),
            control_mode=settings.model_control_mode,
            overlay=pushed.model_dirs if pushed is not None else None,
        )
        try:
            await asyncio.to_thread(registry.discover)
        except FileNotFoundError as exc:
            raise ConfigError(str(exc)) from exc
        registries.append(registry)
        lifecycle.on_close("the models", lambda: cls._close_models(registry))
        traces, tracer = cls._start_tracing(settings, state, lifecycle)
        logs = LogSettings(logging.getLogger(), LogValues.from_level(settings.log_level))

        async def restore_logging() -> None:
            logs.restore()

        lifecycle.on_close("the log settings", restore_logging)
        budget = MemoryBudget(settings.max_request_memory_bytes)
        admission = Admission(AccessPolicy(token, parse_networks(settings.auth_exempt_networks),
                                           settings.protect_inference), settings.max_concurrent_requests)
        hardware: asyncio.Future[dict] = asyncio.get_running_loop().create_future()
        rules = Rules(control_mode=settings.model_control_mode, strict_readiness=settings.strict_readiness,
                      decode=DecodeLimits(settings.max_tensor_elements, settings.max_inputs),
                      streams=StreamLimits(max_bytes=settings.stream_buffer_bytes,
                                           stall_timeout=settings.stream_stall_timeout))
        dataplane = DataPlane(registry, rules, admission=admission, budget=budget, shared_memory=shared_memory,
                              tracer=tracer, traces=traces, logs=logs, pushes=pushes, state=state, hardware=hardware)
        appliance = cls(settings, state, token, budget, metrics, shared_memory, registry, dataplane, traces, logs,
                        hardware, tracer, lifecycle)
        log.info("loading model repository %s", repository)
        task = asyncio.create_task(appliance._load_repository(), name="load-repository")
        task.add_done_callback(appliance._loading_ended)
        lifecycle.on_close("loading the repository", lambda: _cancel(task))
        if settings.selection and settings.retune_on_traffic:
            retuner = Retuner(registry, RetunePolicy(settings.retune_interval, settings.retune_min_requests))
            retuning = asyncio.create_task(retuner.run(dataplane.wait_loaded), name="retune-on-traffic")
            lifecycle.on_close("retuning on traffic", lambda: _cancel(retuning))
        return appliance

    @staticmethod
    async def _start_metrics(settings: Settings, state: StateDir, registries: list[ModelRegistry],
                             lifecycle: Lifecycle, custom: CustomMetrics | None) -> MetricsService | None:
        if not settings.metrics:
            return None
        service = MetricsService(
            settings.metrics_db, _retention(settings), settings.metrics_interval,
            lambda: registries[0].ready_versions() if registries else [], state, custom=custom,
        )
        await service.start()
        service.event("daemon_start", detail={"version": __version__})

        async def stop() -> None:
            service.event("daemon_stop")
            await service.stop()

        lifecycle.on_close("the metrics history", stop)
        return service

    @staticmethod
    def _start_tracing(settings: Settings, state: StateDir, lifecycle: Lifecycle) -> tuple[TraceSettings, Tracer]:
        """Traces go to files under the state dir (or where trace_path says); a read-only directory keeps
        them in memory (bounded)."""
        # A read-only state dir is reported once (its read_only problem says traces stay in memory).
        where = Path(settings.trace_path).parent if settings.trace_path is not None else settings.state_dir
        fix = f"make {where} writable, then restart the daemon"

        def failed(reason: str) -> None:
            state.note("traces", f"{reason}: traces are kept in memory only", fix)

        if settings.trace_path is not None:  # Triton's --trace-config triton,file=<path>: where the operator said
            path = Path(settings.trace_path).expanduser().absolute()
            directory: Path | None = path.parent
            name, reported = path.name, settings.trace_path
        else:
            directory = settings.trace_dir if state.writable else None
            name, reported = settings.trace_file, str(settings.trace_dir / settings.trace_file)
        writer = TraceWriter(directory, name, settings.trace_max_bytes, on_error=failed)
        lifecycle.on_close("the trace writer", lambda: asyncio.to_thread(writer.close))
        defaults = TraceValues(settings.trace_level, settings.trace_rate, settings.trace_count,
                               settings.trace_log_frequency)
        traces = TraceSettings(defaults, trace_file=reported, mode=settings.trace_mode)
        return traces, Tracer(traces, writer)

    @staticmethod
    def _open_pushes(settings: Settings, state: StateDir) -> tuple[PushStore | None, PushStore | None]:
        """The models pushed over the load API in earlier runs: (the store serving them, the store taking
        new pushes). A read-only state dir still serves what was pushed before, and takes no new push."""
        store = PushStore(settings.pushed_dir, PushLimits(settings.push_max_file_bytes, settings.push_max_total_bytes))
        try:
            pushed = store.open()
        except OSError as exc:
            state.note("pushed_models_unreadable",
                       f"the pushed models in {settings.pushed_dir} cannot be read ({exc.strerror or exc}): they are "
                       "not served, and pushes are refused", f"make {settings.pushed_dir} readable and writable")
            return None, None
        if pushed:
            log.info("pushed models kept from earlier runs: %s", ", ".join(sorted(pushed)))
        return store, store if state.writable else None

    @staticmethod
    def _repository(settings: Settings, state: StateDir) -> tuple[Path, Path | None]:
        """The repository, and a temporary directory to remove at stop (where the example went)."""
        if settings.model_repository is not None:
            return settings.model_repository, None
        return example_repository(settings.example_repository_dir, state)

    @staticmethod
    async def _end_children(children: ChildProcesses, exit_timeout: float) -> None:
        if not children.alive():
            return
        log.info("waiting up to %.0f s (exit_timeout) for model processes still busy", exit_timeout)
        killed = await asyncio.to_thread(children.stop, exit_timeout)
        if killed:
            log.warning("killed the processes of models %s: still busy after exit_timeout", ", ".join(killed))

    @staticmethod
    async def _close_models(registry: ModelRegistry) -> None:
        errors = await registry.close(CLOSE_GRACE)
        for error in errors:
            log.error("error while closing a model: %s", error)

    async def _load_repository(self) -> None:
        settings, registry, dataplane = self.settings, self.registry, self.dataplane
        # Probing imports the runtimes (seconds): done with the front ends already answering, and in a
        # child process, so that a daemon serving only ONNX never holds torch or OpenVINO.
        report = await asyncio.to_thread(hardware_probe.probe_isolated, 15.0)
        self.hardware.set_result({**report.to_json(), "summary": report.summary()})
        log.info("hardware: %s", report.summary())
        if self.metrics is not None:
            self.metrics.event("hardware", detail={"fingerprint": report.fingerprint, "summary": report.summary()})
        selector = make_selector(settings, report, isolate=True, state=self.state)
        explicit = settings.model_control_mode == "explicit" and "*" not in settings.load_models
        # Pushed models were loaded by a request: they serve again after a restart, in every mode.
        await registry.load_all((*settings.load_models, *registry.pushed_names()) if explicit else None,
                                selector=selector)
        dataplane.mark_loaded()
        log.info("repository loaded: %d of %d models ready", registry.ready_count(), len(registry.entries()))
        if settings.model_control_mode == "poll":
            while True:
                await asyncio.sleep(settings.repository_poll_secs)
                changes = await registry.rescan()
                if any(changes.values()):
                    log.info("repository poll: %s", changes)

    def _loading_ended(self, task: asyncio.Task) -> None:
        """A load task that died leaves models LOADING for ever: say why at once and stop being live,
        so that a supervisor (systemd's watchdog, a Kubernetes liveness probe) restarts the daemon."""
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        assert exc is not None
        reason = f"loading the model repository failed: {type(exc).__name__}: {exc}"
        log.error("%s; the daemon reports itself not live", reason, exc_info=exc)
        self.dataplane.fail(reason)

    async def close(self) -> list[BaseException]:
        """Stop everything in reverse order of start; the errors met on the way (each logged)."""
        return await self._lifecycle.close()


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    except Exception:  # noqa: BLE001 - reported by _loading_ended already
        pass
