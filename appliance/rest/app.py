"""The aiohttp application: routes, the error middleware, and resource lifecycles (cleanup_ctx)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

import hardware_probe
from hardware_probe import ProbeReport
from model_cache import ModelCache

from appliance.backends import RuntimeOptions
from appliance.core.dataplane import DataPlane
from appliance.core.registry import ModelRegistry
from appliance.errors import ConfigError
from appliance.examples import ensure_example_repository
from appliance.rest.errors import error_middleware
from appliance.rest.handlers import ROUTES
from appliance.rest.keys import DATAPLANE, PROBE, SETTINGS
from appliance.selection import Selector
from appliance.selection.selector import SelectionSettings
from appliance.settings import Settings

__all__ = ["build_app", "resolve_repository"]

log = logging.getLogger(__name__)


def resolve_repository(settings: Settings) -> Path:
    """The repository to serve: the configured one, else the built-in example (generated once)."""
    if settings.model_repository is not None:
        return settings.model_repository
    return ensure_example_repository(settings.example_repository_dir)


def make_selector(settings: Settings, report: ProbeReport) -> Selector | None:
    if not settings.selection:
        return None
    return Selector(
        report,
        report.fingerprint,
        report.runtime_versions(),
        ModelCache(settings.cache_dir, settings.cache_max_bytes),
        SelectionSettings(budget=settings.tune_budget),
        cpu_flags=tuple(report.cpu_flags()),
    )


async def _models_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    repository = await asyncio.to_thread(resolve_repository, settings)
    registry = ModelRegistry(
        repository,
        RuntimeOptions(onnx_providers=settings.onnx_providers, intra_op_threads=settings.intra_op_threads),
        retune=settings.retune,
    )
    try:
        await asyncio.to_thread(registry.discover)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from exc
    dataplane = DataPlane(registry, strict_readiness=settings.strict_readiness)
    app[DATAPLANE] = dataplane
    log.info("loading model repository %s", repository)

    async def load() -> None:
        # Probing imports the runtimes (seconds): done here, with the port already answering.
        report = await asyncio.to_thread(hardware_probe.probe, 15.0)
        app[PROBE] = report
        log.info("hardware: %s", report.summary())
        registry.selector = make_selector(settings, report)
        await registry.load_all()
        dataplane.loaded = True
        log.info("repository loaded: %d of %d models ready", registry.ready_count(), len(registry.entries()))

    task = asyncio.create_task(load(), name="load-repository")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for error in await registry.close(settings.shutdown_timeout):
            log.error("error while closing a model: %s", error)


def build_app(settings: Settings) -> web.Application:
    app = web.Application(client_max_size=settings.max_request_bytes, middlewares=[error_middleware])
    app[SETTINGS] = settings
    app.cleanup_ctx.append(_models_ctx)
    app.add_routes(ROUTES)
    return app
