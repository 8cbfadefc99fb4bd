"""The aiohttp application: routes, the error middleware, and resource lifecycles (cleanup_ctx)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

import hardware_probe
from hardware_probe import ProbeReport

from appliance.backends import RuntimeOptions
from appliance.budget import MemoryBudget
from appliance.core.dataplane import DataPlane
from appliance.core.registry import ModelRegistry
from appliance.errors import ConfigError, Unavailable
from appliance.examples import ensure_example_repository, example_repository
from appliance.rest import security
from appliance.rest.errors import error_middleware
from appliance.rest.browser import host_policy
from appliance.rest.handlers import CONTROL_HANDLERS, OPEN_HANDLERS, ROUTES, UNLIMITED_HANDLERS
from appliance import __version__
from appliance.metrics.service import MetricsService
from appliance.metrics.store import Retention
from appliance.rest.body import BodyLimits
from appliance.rest.codec import DecodeLimits
from appliance.rest.keys import BODY_LIMITS, BUDGET, DATAPLANE, LIMITS, METRICS, SETTINGS, STATE
from appliance.selection import Selector
from appliance.selection.selector import SelectionSettings, open_cache
from appliance.settings import Settings
from appliance.state import StateDir

__all__ = ["build_app", "resolve_repository"]

log = logging.getLogger(__name__)

# What models get to finish and close when the application is cleaned up. The HTTP server has stopped
# by then: every request finished or was cancelled at the shutdown deadline, so what is left is at most
# a batch that a cancelled request left running in a runtime; waiting a second shutdown_timeout for it
# would double the stop.
_CLOSE_GRACE = 1.0


def resolve_repository(settings: Settings) -> Path:
    """The repository to serve: the configured one, else the built-in example (generated once)."""
    if settings.model_repository is not None:
        return settings.model_repository
    return ensure_example_repository(settings.example_repository_dir)


def runtime_options(settings: Settings) -> RuntimeOptions:
    return RuntimeOptions(onnx_providers=settings.onnx_providers, intra_op_threads=settings.intra_op_threads)


def _serving_repository(settings: Settings, state: StateDir) -> tuple[Path, Path | None]:
    """The repository, and a temporary directory to remove at stop (where the example went)."""
    if settings.model_repository is not None:
        return settings.model_repository, None
    return example_repository(settings.example_repository_dir, state)


def _control_token(settings: Settings, state: StateDir) -> str:
    """The configured token, else the one saved in the state dir; one that cannot be saved (or read)
    is kept in memory, so that the daemon still starts."""
    if settings.auth_token:
        return settings.auth_token
    try:  # an empty or short token file is a ConfigError: the daemon refuses to start and says why
        return security.ensure_token(settings.state_dir)
    except OSError as exc:
        problem = exc.strerror or str(exc)
    state.note("token_not_saved",
               f"the control token in {settings.state_dir / 'auth-token'} cannot be read or saved ({problem}): "
               f"using a one-off token kept in memory, so until a restart the token-protected endpoints "
               f"(load/unload; everything but health with protect_inference) answer only clients in "
               f"auth_exempt_networks",
               "make the state dir writable (a missing token file is then created), or set the "
               "auth_token setting (APPLIANCE_AUTH_TOKEN), and restart")
    return secrets.token_urlsafe(32)


def make_selector(settings: Settings, report: ProbeReport, isolate: bool = False,
                  state: StateDir | None = None) -> Selector | None:
    """``isolate``: measure candidates in a child process (the daemon), not in this one (the CLI).
    ``state``: the daemon's checked state dir (checked here for the CLI)."""
    if not settings.selection:
        return None
    state = state or StateDir.check(settings.state_dir)
    return Selector(
        report,
        report.fingerprint,
        report.runtime_versions(),
        open_cache(settings.cache_dir, settings.cache_max_bytes, state),
        SelectionSettings(budget=settings.tune_budget),
        cpu_flags=tuple(report.cpu_flags()),
        isolate=isolate,
        state=state,
    )


async def _models_ctx(app: web.Application) -> AsyncIterator[None]:
    settings, state = app[SETTINGS], app[STATE]
    repository, scratch = await asyncio.to_thread(_serving_repository, settings, state)
    registry = ModelRegistry(
        repository,
        runtime_options(settings),
        retune=settings.retune,
        drain_timeout=settings.shutdown_timeout,
    )
    try:
        await asyncio.to_thread(registry.discover)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from exc
    dataplane = DataPlane(registry, strict_readiness=settings.strict_readiness,
                          control_mode=settings.model_control_mode)
    app[DATAPLANE] = dataplane
    metrics = app.get(METRICS)
    if metrics is not None:
        registry.on_event = metrics.event
    log.info("loading model repository %s", repository)

    async def load() -> None:
        # Probing imports the runtimes (seconds): done with the port already answering, and in a
        # child process, so that a daemon serving only ONNX never holds torch or OpenVINO.
        report = await asyncio.to_thread(hardware_probe.probe_isolated, 15.0)
        dataplane.hardware = {**report.to_json(), "summary": report.summary()}
        log.info("hardware: %s", report.summary())
        if metrics is not None:
            metrics.event("hardware", detail={"fingerprint": report.fingerprint, "summary": report.summary()})
        registry.selector = make_selector(settings, report, isolate=True, state=state)
        explicit = settings.model_control_mode == "explicit" and "*" not in settings.load_models
        await registry.load_all(settings.load_models if explicit else None)
        dataplane.mark_loaded()
        log.info("repository loaded: %d of %d models ready", registry.ready_count(), len(registry.entries()))
        if settings.model_control_mode == "poll":
            while True:
                await asyncio.sleep(settings.repository_poll_secs)
                changes = await registry.rescan()
                if any(changes.values()):
                    log.info("repository poll: %s", changes)

    task = asyncio.create_task(load(), name="load-repository")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for error in await registry.close(_CLOSE_GRACE):
            log.error("error while closing a model: %s", error)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


async def _metrics_ctx(app: web.Application) -> AsyncIterator[None]:
    """Set up before the models (so it sees them load) and torn down after them (so it records their
    unloading and the last requests)."""
    settings = app[SETTINGS]
    if not settings.metrics:
        yield
        return

    def models() -> list:
        dataplane = app.get(DATAPLANE)
        return dataplane.registry.ready_versions() if dataplane is not None else []

    retention = Retention(
        raw_seconds=int(settings.history_raw_hours * 3600),
        minute_seconds=int(settings.history_minute_days * 86400),
        hour_seconds=int(settings.history_hour_days * 86400),
        max_bytes=settings.history_max_bytes,
    )
    service = MetricsService(settings.metrics_db, retention, settings.metrics_interval, models, app[STATE])
    await service.start()
    app[METRICS] = service
    service.event("daemon_start", detail={"version": __version__})
    try:
        yield
    finally:
        service.event("daemon_stop")
        await service.stop()


def access_rules(settings: Settings, token: str) -> security.AccessRules:
    return security.AccessRules(
        token=token,
        control=CONTROL_HANDLERS,
        open=OPEN_HANDLERS,
        unlimited=UNLIMITED_HANDLERS,
        exempt=security.parse_networks(settings.auth_exempt_networks),
        trusted_proxies=security.parse_networks(settings.trusted_proxies),
        protect_inference=settings.protect_inference,
        hosts=host_policy(settings.allowed_hosts, settings.name),
    )


def build_app(settings: Settings, state: StateDir | None = None) -> web.Application:
    """``state``: the state dir as checked at start (checked here when not given)."""
    app = web.Application(client_max_size=settings.max_request_bytes, middlewares=[error_middleware])
    app[SETTINGS] = settings
    app[STATE] = state or StateDir.check(settings.state_dir)
    app[LIMITS] = DecodeLimits(settings.max_tensor_elements, settings.max_inputs)
    app[BODY_LIMITS] = BodyLimits(settings.max_request_bytes, settings.body_timeout)
    app[BUDGET] = MemoryBudget(settings.max_request_memory_bytes)
    security.install(app, access_rules(settings, _control_token(settings, app[STATE])))
    app.cleanup_ctx.append(_metrics_ctx)
    app.cleanup_ctx.append(_models_ctx)
    app.add_routes(ROUTES)
    return app


def build_metrics_app(main: web.Application) -> web.Application:
    """The separate metrics port (Triton's 8002): /metrics of the main application, nothing else."""
    app = web.Application(middlewares=[error_middleware])
    app[SETTINGS] = main[SETTINGS]
    # The same token and Host rules as the main port; scrapes stay outside the request bound.
    security.install(app, main[security.ACCESS], limit_requests=False)

    async def metrics(request: web.Request) -> web.Response:
        service = main.get(METRICS)
        if service is None:
            raise Unavailable("metrics are not running")
        return web.Response(body=await asyncio.to_thread(service.prometheus),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/metrics", metrics)
    return app
