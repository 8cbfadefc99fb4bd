"""The repeat filter: a burst per interval, then one line that counts what was suppressed; asyncio's
accept-error flood (file descriptors exhausted) is the case it exists for."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import textwrap

from appliance.runtime import log_limit


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _logger(name: str) -> tuple[logging.Logger, _Collect, list[float]]:
    now = [0.0]
    handler = _Collect()
    handler.addFilter(log_limit.RepeatFilter(handler, burst=3, interval=10.0, clock=lambda: now[0]))
    logger = logging.getLogger(name)
    logger.propagate = False
    logger.handlers[:] = [handler]
    return logger, handler, now


def test_a_burst_passes_then_one_line_counts_the_rest():
    logger, handler, now = _logger("tests.repeat.burst")
    for i in range(100):
        logger.warning("refused a connection from %s", f"10.0.0.{i}")
    assert handler.lines == [f"refused a connection from 10.0.0.{i}" for i in range(3)]
    logger.warning("something else")  # another kind passes
    now[0] = 11.0
    logger.warning("refused a connection from %s", "10.0.0.200")
    assert handler.lines[-2:] == [
        "suppressed 97 similar messages in the last 11 s: refused a connection from %s",
        "refused a connection from 10.0.0.200",
    ]


def test_install_is_idempotent():
    handler = _Collect()
    assert log_limit.install(handler) is log_limit.install(handler)
    assert len(handler.filters) == 1


FLOOD = textwrap.dedent('''
    import asyncio, logging, resource, sys
    from appliance.runtime import log_limit

    logging.basicConfig(stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    if sys.argv[1] == "filtered":
        log_limit.install(logging.getLogger().handlers[0], burst=3, interval=1.0)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    async def main():
        held = []
        class Hold(asyncio.Protocol):
            def connection_made(self, transport):
                held.append(transport)  # never closed: descriptors run out
        server = await asyncio.get_running_loop().create_server(Hold, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.sleep(float(sys.argv[2]))

    asyncio.run(main())
''')


def _flood(mode: str, seconds: float) -> list[str]:
    process = subprocess.Popen([sys.executable, "-c", FLOOD, mode, str(seconds)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    port = int(process.stdout.readline())
    clients = []
    try:
        for _ in range(150):  # more connections than the 64 descriptors allow
            clients.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        _, stderr = process.communicate(timeout=seconds + 20)
    finally:
        for client in clients:
            client.close()
        if process.poll() is None:
            process.kill()
    return stderr.splitlines()


def test_the_accept_error_flood_becomes_a_trickle():
    unfiltered = _flood("plain", 2.5)
    filtered = _flood("filtered", 2.5)
    accept_errors = sum("socket.accept() out of system resource" in line for line in unfiltered)
    assert accept_errors > 20, unfiltered[-20:]  # the flood, reproduced
    kept = [line for line in filtered if line.startswith("ERROR asyncio")]
    assert 3 <= len(kept) <= 3 * 3 + 3, filtered  # a burst per 1 s interval and a count line
    assert any("suppressed" in line and "similar messages" in line for line in kept)
    assert len(filtered) < len(unfiltered) / 5
