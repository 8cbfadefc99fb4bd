"""The connection limiter in front of a plain asyncio server, and fitting the bound to the descriptors."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import uvloop

from appliance.rest.refusal import http_connection_limiter
from appliance.tls.context import ServerTls
from tests.tls_util import Pki
from tests.waiting import await_until


class _Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


async def _open(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def test_connections_beyond_the_limit_get_503_and_slots_come_back():
    limiter = http_connection_limiter(3)
    server = await asyncio.get_running_loop().create_server(limiter.wrap(_Echo), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        held = [await _open(port) for _ in range(3)]
        for reader, writer in held:  # the three are served
            writer.write(b"ping")
            assert await asyncio.wait_for(reader.readexactly(4), 2) == b"ping"
        assert limiter.open == 3
        reader, writer = await _open(port)
        answer = await asyncio.wait_for(reader.read(), 2)  # answered and closed at once
        writer.close()
        assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") and b"Retry-After: 1" in answer
        assert b"max_connections" in answer and limiter.refused == 1
        for _, writer in held:
            writer.close()
        await await_until(lambda: limiter.open == 0, timeout=5,
                          what="every slot given back once its connection closed")
        reader, writer = await _open(port)
        writer.write(b"again")
        assert await asyncio.wait_for(reader.readexactly(5), 2) == b"again"
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_one_limit_is_shared_by_every_server_it_wraps():
    limiter = http_connection_limiter(1)
    loop = asyncio.get_running_loop()
    first = await loop.create_server(limiter.wrap(_Echo), "127.0.0.1", 0)
    second = await loop.create_server(limiter.wrap(_Echo), "127.0.0.1", 0)
    try:
        _, held = await _open(first.sockets[0].getsockname()[1])
        reader, writer = await _open(second.sockets[0].getsockname()[1])
        assert (await asyncio.wait_for(reader.read(), 2)).startswith(b"HTTP/1.1 503")
        writer.close()
        held.close()
    finally:
        for server in (first, second):
            server.close()
            await server.wait_closed()


async def _refuse_over_tls(pki: Pki) -> bytes:
    """A second TLS connection to a port capped at one: what it reads before the server closes it."""
    limiter = http_connection_limiter(1)
    server_context = ServerTls(pki.cert, pki.key).context()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(limiter.wrap(_Echo), "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    try:
        held_reader, held = await asyncio.open_connection("127.0.0.1", port, ssl=pki.context())
        held.write(b"ping")
        assert await asyncio.wait_for(held_reader.readexactly(4), 5) == b"ping"
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=pki.context())
        writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        refused = await asyncio.wait_for(reader.read(), 5)  # answered, then closed by the server
        writer.close()
        held.close()
        await await_until(lambda: limiter.open == 0, timeout=5, what="the served connection's slot back")
        return refused
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
def test_a_tls_connection_beyond_the_limit_is_refused_quietly(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                              loop_factory: Callable[[], asyncio.AbstractEventLoop]):
    """A TLS transport cannot half-close (no write_eof): the refusal closes it after the 503 instead of
    logging a traceback for every connection past the cap."""
    pki = Pki(tmp_path / "pki")
    with caplog.at_level(logging.DEBUG), asyncio.Runner(loop_factory=loop_factory) as runner:
        answer = runner.run(_refuse_over_tls(pki))
    assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") and b"max_connections" in answer
    tracebacks = [record for record in caplog.records if record.exc_info or record.levelno >= logging.ERROR]
    assert not tracebacks, [record.getMessage() for record in tracebacks]


FIT = textwrap.dedent('''
    import logging, resource, sys
    from appliance.rest.http_server import fit_connections_to_descriptors
    logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(message)s")
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))
    print("fits", fit_connections_to_descriptors(int(sys.argv[3])))
    print("soft", resource.getrlimit(resource.RLIMIT_NOFILE)[0])
''')


def _fit(soft: int, hard: int, wanted: int) -> str:
    return subprocess.run([sys.executable, "-c", FIT, str(soft), str(hard), str(wanted)],
                          capture_output=True, text=True, check=True).stdout


def test_the_soft_descriptor_limit_is_raised_to_fit():
    out = _fit(300, 8192, 1000)
    assert "fits 1000" in out and "soft 1256" in out and "WARNING" not in out


def test_a_low_hard_limit_lowers_the_bound_and_says_how_to_fix_it():
    out = _fit(300, 300, 1000)
    assert "fits 44" in out and "LimitNOFILE=" in out
