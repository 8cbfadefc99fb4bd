"""Run the daemon: bind, serve until SIGTERM/SIGINT, then stop gracefully."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from typing import TYPE_CHECKING

from appliance import __version__
from appliance.composition import Appliance, compose
from appliance.grpc.http2.server import Http2Server
from appliance.mdns.fleet import FleetView
from appliance.protocol.front_end import FrontEnd
from appliance.rest.app import build_app, build_metrics_app
from appliance.rest.http_server import HttpServer, fit_connections_to_descriptors
from appliance.rest.lane import InferLane
from appliance.rest.refusal import http_connection_limiter
from appliance.runtime.allocator import tune_allocator
from appliance.settings import Settings
from appliance.settings.sections import FleetSection
from appliance.systemd.notify import Notifier

if TYPE_CHECKING:
    from appliance.client.boxes import Browser
    from appliance.mdns.announcer import Announcer

__all__ = ["serve"]

log = logging.getLogger(__name__)

def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host

async def _announce_ready(appliance: Appliance, notifier: Notifier) -> None:
    """READY=1 once the repository is loaded (the port is bound before this task starts), then keep
    STATUS= current."""
    dataplane = appliance.dataplane
    await dataplane.wait_loaded()
    notifier.ready(dataplane.status_line())
    log.info("ready: %s", dataplane.status_line())
    while True:
        await asyncio.sleep(5)
        notifier.status(dataplane.status_line())

async def _reload(appliance: Appliance, notifier: Notifier) -> None:
    """SIGHUP / ExecReload: re-scan the repository."""
    notifier.reloading()
    dataplane = appliance.dataplane
    await dataplane.wait_loaded()
    changes = await appliance.registry.rescan()
    log.info("repository re-scanned: added %s, removed %s, reloaded %s", changes["added"] or "none",
             changes["removed"] or "none", changes["reloaded"] or "none")
    notifier.ready(dataplane.status_line())

async def _start_announcer(appliance: Appliance, port: int, grpc_port: int | None, own_id: str) -> Announcer:
    from appliance.mdns.announcer import Announcer, catalog_digest  # zeroconf loads only with mDNS on

    fleet, registry, hardware = appliance.settings.fleet, appliance.registry, appliance.hardware

    def accelerators() -> list[str]:
        return hardware.result().get("accelerators", ["cpu"]) if hardware.done() else ["cpu"]

    announcer = Announcer(
        fleet.box_name(socket.gethostname()),
        port,
        appliance.settings.http.address or appliance.settings.server.host,  # where the HTTP port listens
        fleet.mdns_interfaces,
        own_id,
        accelerators,
        registry.ready_count,
        grpc_port,
        lambda: catalog_digest(registry.ready_names()),
        tls=[port for port, tls in (("http", appliance.rest.tls), ("grpc", appliance.grpc and appliance.grpc.tls))
             if tls is not None],
    )
    await announcer.start()
    return announcer

async def _browse(fleet: FleetSection, own_id: str) -> tuple[Browser | None, FleetView]:
    """The dashboard's fleet panel: the boxes this one sees on the LAN, from its own mDNS browser (one
    that cannot start is reported there, and the daemon serves on)."""
    if not fleet.mdns:
        return None, FleetView(None, own_id)
    from appliance.client.boxes import Browser  # zeroconf loads only with mDNS on

    try:
        browser = await asyncio.to_thread(Browser, fleet.mdns_interfaces)
    except OSError as exc:
        log.warning("cannot browse the LAN over mDNS (%s): the dashboard's fleet panel stays empty", exc)
        return None, FleetView(None, own_id, f"cannot browse the LAN over mDNS: {exc}")
    return browser, FleetView(browser, own_id)


async def serve(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set (or a SIGTERM/SIGINT arrives when no event is given)."""
    loop = asyncio.get_running_loop()
    tune_allocator()  # large buffers go back to the system when freed, a heap keeps a few MiB for reuse
    server_section, fleet_section = settings.server, settings.fleet
    notifier = Notifier(server_section.notify_socket, server_section.watchdog_usec)
    background: set[asyncio.Task] = set()

    def spawn(coroutine) -> None:
        task = loop.create_task(coroutine)
        background.add(task)
        task.add_done_callback(background.discard)

    # One bound on connections over every port, fitted under the file-descriptor limit: the gRPC port
    # takes its share of it, the HTTP and metrics ports count the rest together.
    appliance = await compose(settings, fit_connections_to_descriptors(settings.http.max_connections))
    state = appliance.state
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, lambda: spawn(_reload(appliance, notifier)))
    header_timeout, host = settings.http.header_timeout, server_section.host
    # Triton's --http-address, --grpc-address and --metrics-address; the metrics port follows HTTP's.
    http_host, grpc_host = settings.http.address or host, settings.grpc.address or host
    metrics_host = settings.metrics.address or http_host
    http_tls = appliance.rest.tls.context() if appliance.rest.tls is not None else None
    limiter = http_connection_limiter(appliance.http_connections)
    own_id = appliance.box_id
    browser, fleet = await _browse(fleet_section, own_id)
    app = build_app(appliance.dataplane, appliance.rest, metrics=appliance.metrics, fleet=fleet)
    lane = InferLane(appliance.dataplane, appliance.rest, header_timeout) if settings.http.infer_lane else None
    server = HttpServer(app, limiter, header_timeout, lane, http_tls)
    metrics_server: HttpServer | None = None
    grpc_server: Http2Server | None = None
    announcer: Announcer | None = None
    deadline: float | None = None
    try:
        await server.start(http_host, settings.http.port)
        for address in server.addresses:
            log.info("appliance %s serving KServe v2 on %s://%s:%d (state dir %s)", __version__,
                     "https" if http_tls else "http", _host(address[0]), address[1], server_section.state_dir)
        if appliance.grpc is not None:
            grpc_server = Http2Server.over(appliance.dataplane, appliance.grpc)
            grpc_port = await grpc_server.start(grpc_host, settings.grpc.port)
            log.info("serving KServe v2 over gRPC%s on %s:%d", " (TLS)" if appliance.grpc.tls else "",
                     _host(grpc_host), grpc_port)
        if state.degraded:
            log.warning("%s", state.summary())
        if settings.metrics.port is not None and appliance.metrics is not None:
            metrics_server = HttpServer(build_metrics_app(appliance.dataplane, appliance.rest, appliance.metrics),
                                        limiter, header_timeout, tls=http_tls)
            await metrics_server.start(metrics_host, settings.metrics.port, "--metrics-port")
            for address in metrics_server.addresses:
                log.info("serving Prometheus metrics on %s://%s:%d/metrics", "https" if http_tls else "http",
                         _host(address[0]), address[1])
        spawn(_announce_ready(appliance, notifier))
        spawn(notifier.watchdog())
        if fleet_section.mdns:
            announcer = await _start_announcer(appliance, server.addresses[0][1],
                                               grpc_server.port if grpc_server is not None else None, own_id)
        await stop.wait()
        # One deadline for the whole stop, whatever each stage would allow on its own.
        deadline = time.monotonic() + server_section.shutdown_timeout
        notifier.stopping()
        if announcer is not None:
            await announcer.stop()  # goodbye first: clients stop picking this box while it drains
        log.info("stopping: finishing in-flight requests (up to %.0f s)", server_section.shutdown_timeout)
    finally:
        if deadline is None:
            deadline = time.monotonic() + server_section.shutdown_timeout
        for task in list(background):
            task.cancel()
        if announcer is not None:
            await announcer.stop()
        if browser is not None:
            await asyncio.to_thread(browser.close)
        # Stop accepting, let accepted requests (running or queued) finish by the deadline, then tear
        # the rest down. Every front end drains at once, to the same deadline.
        fronts: list[FrontEnd | None] = [metrics_server, server, grpc_server]
        stops = [front.stop(deadline) for front in fronts if front is not None]
        for error in await asyncio.gather(*stops, return_exceptions=True):
            if isinstance(error, BaseException):
                log.error("error while stopping a front end: %s: %s", type(error).__name__, error, exc_info=error)
        await appliance.close()  # every front end has stopped: now the models and the history
        notifier.close()
    log.info("stopped")
