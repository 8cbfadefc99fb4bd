"""A real redis-server for a test (Debian's package; .ci/run installs it): on 127.0.0.1, a free port,
nothing saved, its files in the test's temporary directory. Tests skip, saying why, where it is missing."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from tests.waiting import wait_until

__all__ = ["RedisServer", "redis_server"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RedisServer:
    def __init__(self, directory: Path, *options: str, tls: dict[str, Path] | None = None,
                 password: str | None = None) -> None:
        self.port = _free_port()
        self.password = password
        self.directory = directory
        self.tls = tls
        plain = "0" if tls else str(self.port)
        command = ["redis-server", "--bind", "127.0.0.1", "--port", plain, "--save", "", "--appendonly", "no",
                   "--dir", str(directory), *(["--requirepass", password] if password else []), *options]
        if tls:
            command += ["--tls-port", str(self.port), "--tls-cert-file", str(tls["cert"]),
                        "--tls-key-file", str(tls["key"]), "--tls-ca-cert-file", str(tls["ca"]),
                        "--tls-auth-clients", "optional"]
        self.log = (directory / f"redis-{self.port}.log").open("w")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            self._wait()
        except BaseException:
            self.stop()  # a server that never answered is not left running
            raise

    def client(self) -> redis.Redis:
        if self.tls:
            return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, ssl=True,
                               ssl_ca_certs=str(self.tls["ca"]))
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password)

    def _wait(self) -> None:
        def answers() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited: {(self.directory / f'redis-{self.port}.log').read_text()}")
            try:
                return bool(self.client().ping())
            except redis.RedisError:
                return False

        try:
            wait_until(answers, timeout=15, what="redis-server to answer PING", interval=0.05)
        except AssertionError:
            raise TimeoutError("redis-server did not answer PING in 15 s") from None

    def keys(self) -> list[bytes]:
        return sorted(self.client().keys("*"))

    def pause(self) -> None:
        """The server stops answering (SIGSTOP): connections stay open, nothing comes back."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


@contextmanager
def redis_server(directory: Path, *options: str, tls: dict[str, Path] | None = None,
                 password: str | None = None) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server; .ci/run installs it)")
    server = RedisServer(directory, *options, tls=tls, password=password)
    try:
        yield server
    finally:
        server.stop()
