"""An appliance served inside the test process (as MLServer's tests/rest/conftest.py): the composition root
and the HTTP and gRPC front ends, started on an event loop of their own in a background thread on
127.0.0.1 ephemeral ports, and stopped in reverse. Behaviour tests that only talk HTTP/gRPC to a server use
it; tests where the process is the point (the CLI, signals, model processes, systemd, crashes) keep the
subprocess daemons of tests/conftest.py.

The loop runs in its own thread so that the tests' synchronous clients (urllib, tritonclient) can call the
server without deadlocking the loop that serves them."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from appliance.composition import Appliance, compose
from appliance.grpc.http2.server import Http2Server
from appliance.mdns.fleet import FleetView
from appliance.rest.app import build_app
from appliance.rest.http_server import HttpServer
from appliance.rest.lane import InferLane
from appliance.rest.refusal import http_connection_limiter
from appliance.settings import Settings
from tests.served import Addresses

__all__ = ["InProcessServer", "in_process_factory"]

T = TypeVar("T")

_START_TIMEOUT = 60.0


@dataclass
class InProcessServer(Addresses):
    """A served appliance; the surface tests use from tests.conftest.Daemon (port, grpc_port, url, grpc_url,
    base), plus the Appliance itself."""

    settings: Settings
    appliance: Appliance | None = None
    port: int = 0
    grpc_port: int | None = None
    """None when the server serves no gRPC (grpc=False)."""
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _http: HttpServer | None = field(default=None, repr=False)
    _grpc: Http2Server | None = field(default=None, repr=False)

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = _START_TIMEOUT) -> T:
        """Runs ``coroutine`` on the server's loop and returns its result (from the test's thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def start(self, wait_loaded: bool = True) -> InProcessServer:
        self._thread = threading.Thread(target=self._loop.run_forever, name="in-process-server", daemon=True)
        self._thread.start()
        try:
            self.call(self._start(wait_loaded))
        except BaseException:
            self.stop()
            raise
        return self

    async def _start(self, wait_loaded: bool) -> None:
        settings = self.settings
        self.appliance = appliance = await compose(settings)
        app = build_app(appliance.dataplane, appliance.rest, metrics=appliance.metrics,
                        fleet=FleetView(None, appliance.box_id))
        header_timeout = settings.http.header_timeout
        lane = InferLane(appliance.dataplane, appliance.rest, header_timeout) if settings.http.infer_lane else None
        tls = appliance.rest.tls.context() if appliance.rest.tls is not None else None
        self._http = HttpServer(app, http_connection_limiter(appliance.http_connections), header_timeout, lane, tls)
        await self._http.start("127.0.0.1", 0)
        self.port = self._http.addresses[0][1]
        if appliance.grpc is not None:
            self._grpc = Http2Server.over(appliance.dataplane, appliance.grpc)
            self.grpc_port = await self._grpc.start("127.0.0.1", 0)
        if wait_loaded:
            await asyncio.wait_for(appliance.dataplane.wait_loaded(), _START_TIMEOUT)

    async def _stop(self) -> None:
        # Reverse of the start: the front ends drain to one deadline, then the appliance closes.
        deadline = self._loop.time() + self.settings.server.shutdown_timeout
        fronts = [front for front in (self._http, self._grpc) if front is not None]
        errors = await asyncio.gather(*(front.stop(deadline) for front in fronts), return_exceptions=True)
        if self.appliance is not None:
            errors += await self.appliance.close()
        failures = [error for error in errors if isinstance(error, BaseException)]
        if failures:
            raise failures[0]

    def stop(self) -> None:
        if self._thread is None:
            return
        try:
            if self._loop.is_running():
                self.call(self._stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_START_TIMEOUT)
            self._thread = None
            self._loop.close()


def in_process_factory(tmp_path_factory) -> Iterator[Callable[..., InProcessServer]]:
    """Factory: serve(repository, wait_loaded=True, **settings) -> InProcessServer (flat settings keys, as
    Settings.build takes them); every server it started is stopped, last started first, when it is done."""
    started: list[InProcessServer] = []

    def serve(repository: Path | None, wait_loaded: bool = True, **values: Any) -> InProcessServer:
        defaults: dict[str, Any] = {
            "state_dir": tmp_path_factory.mktemp("state"), "host": "127.0.0.1", "http_port": 0, "grpc_port": 0,
            "metrics_port": None, "mdns": False, "selection": False,
            # One kept probe report with the subprocess daemons (tests/conftest.py): the box does not change
            # under a test run.
            "probe_cache_file": tmp_path_factory.getbasetemp() / "hardware-probe.json",
        }
        if repository is not None:
            defaults["model_repository"] = repository
        server = InProcessServer(Settings.build(**{**defaults, **values}))
        started.append(server)
        return server.start(wait_loaded)

    yield serve
    for server in reversed(started):
        server.stop()
