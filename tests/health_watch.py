"""A watch on the daemon while a test attacks it: /v2/health/live must keep answering within a second and
its memory must stay within RSS_SLACK_MIB of where it was (hostile tests use it as a context manager).
HealthSampler records the same figures without judging them (bench.grpc_attacks reports them)."""

from __future__ import annotations

import http.client
import threading
import time

from tests.processes import rss_mib

__all__ = ["RSS_SLACK_MIB", "HealthSampler", "HealthWatch"]

RSS_SLACK_MIB = 200


class HealthSampler:
    """Samples the daemon's RSS and /v2/health/live every 0.2 s (each check on a connection of its own, or
    on one kept-alive connection opened before the attack when new connections are expected to be
    refused); a check not answered within ``timeout`` seconds is a failure. ``daemon``: anything with
    ``process`` and ``port``."""

    def __init__(self, daemon, keep_alive: bool, timeout: float = 1.0) -> None:
        self.daemon = daemon
        self.timeout = timeout
        self.baseline = rss_mib(daemon.process.pid)
        self.peak = self.baseline
        self.slowest = 0.0
        self.failures: list[str] = []
        self.checks = 0
        self._stop = threading.Event()
        self._connection = (http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=timeout) if keep_alive
                            else None)
        if self._connection is not None:
            self._health(self._connection)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _health(self, connection: http.client.HTTPConnection) -> None:
        started = time.monotonic()
        try:
            connection.request("GET", "/v2/health/live")
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                self.failures.append(f"health answered {response.status}")
        except OSError as exc:
            self.failures.append(f"health failed: {exc!r}")
        self.slowest = max(self.slowest, time.monotonic() - started)
        self.checks += 1

    def _run(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(0.2):
                return

    def _sample(self) -> None:
        self.peak = max(self.peak, rss_mib(self.daemon.process.pid))
        if self._connection is not None:
            self._health(self._connection)
            return
        connection = http.client.HTTPConnection("127.0.0.1", self.daemon.port, timeout=self.timeout)
        try:
            self._health(connection)
        finally:
            connection.close()

    def __enter__(self) -> HealthSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(5 + self.timeout)
        if self.daemon.process.poll() is None:
            self._sample()  # and once more after the attack
        if self._connection is not None:
            self._connection.close()


class HealthWatch(HealthSampler):
    """HealthSampler that fails the test when health was slow or failed, the daemon died or its RSS grew
    past RSS_SLACK_MIB."""

    def __init__(self, daemon, keep_alive: bool) -> None:
        super().__init__(daemon, keep_alive, timeout=1.0)

    def __enter__(self) -> HealthWatch:
        super().__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        super().__exit__(*exc_info)
        if exc_info[0] is None:
            assert self.daemon.process.poll() is None, "the daemon died"
            assert self.checks >= 1
            assert not self.failures, self.failures[:5]
            assert self.slowest < 1.0, f"health took {self.slowest:.2f} s"
            assert self.peak < self.baseline + RSS_SLACK_MIB, (self.baseline, self.peak)
