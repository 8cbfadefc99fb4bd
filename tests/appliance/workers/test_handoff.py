"""Handing a connection from a worker to the daemon: the socket and every byte read of it arrive, in
order, however many messages they take; malformed or oversized hand-overs are dropped, never served."""

from __future__ import annotations

import asyncio
import os
import random
import socket

from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.workers.handoff import MAX_PENDING, HandOver, Receiver, handoff_pair
from tests.waiting import await_until


async def _hand(pending: bytes) -> tuple[bytes, bytes]:
    """Hand one end of a TCP-like pair over with ``pending``; what the receiver got, and what the client
    side then reads through the handed socket."""
    ours, theirs = handoff_pair()
    served: list[tuple[socket.socket, bytes]] = []
    receiver = Receiver(ours, lambda sock, data: served.append((sock, data)))
    receiver.start()
    client, server_side = socket.socketpair()
    try:
        over = HandOver(theirs)
        await asyncio.to_thread(over.send, server_side.fileno(), pending)
        server_side.close()  # the worker lets go of its copy
        await await_until(lambda: served, timeout=10, what="the connection handed over")
        (handed, got), = served
        handed.sendall(b"answered by the daemon")
        handed.close()
        client.settimeout(5)
        return got, client.recv(100)
    finally:
        client.close()
        receiver.close()
        theirs.close()


@settings(max_examples=25, deadline=None)
@given(pending=st.one_of(st.binary(max_size=200),
                         st.integers(0, 300_000).map(lambda n: random.Random(n).randbytes(n))))
def test_a_handed_connection_arrives_with_every_byte_read_of_it(pending):
    got, reply = asyncio.run(_hand(pending))
    assert got == pending and reply == b"answered by the daemon"


async def test_bytes_of_no_connection_two_sockets_and_a_file_are_dropped():
    ours, theirs = handoff_pair()
    served: list = []
    receiver = Receiver(ours, lambda sock, data: served.append(data))
    receiver.start()
    try:
        theirs.sendall(b"\x00stray bytes with no socket")
        a, b = socket.socketpair()
        socket.send_fds(theirs, [b"\x00two"], [a.fileno(), b.fileno()])  # two sockets in one hand-over
        a.close()
        b.close()
        not_a_socket = os.open(os.devnull, os.O_RDONLY)
        HandOver(theirs).send(not_a_socket, b"\x00dropped")
        os.close(not_a_socket)
        c, d = socket.socketpair()
        HandOver(theirs).send(d.fileno(), b"ok")
        c.close()
        d.close()
        await await_until(lambda: served, timeout=10, what="the well-formed hand-over")
        assert served == [b"ok"]
    finally:
        receiver.close()
        theirs.close()


async def _closed_unserved(send) -> None:
    """Hand a connection over with ``send(worker_end, fd)``: the daemon closes it and serves nothing."""
    ours, theirs = handoff_pair()
    served: list = []
    receiver = Receiver(ours, lambda sock, data: served.append(data))
    receiver.start()
    client, server_side = socket.socketpair()
    try:
        await asyncio.to_thread(send, theirs, server_side.fileno())
        server_side.close()
        client.settimeout(10)
        assert await asyncio.to_thread(client.recv, 10) == b""  # the daemon closed it
        assert served == []
    finally:
        client.close()
        receiver.close()
        theirs.close()


async def test_a_hand_over_beyond_the_bound_is_closed_not_served():
    await _closed_unserved(lambda end, fd: HandOver(end).send(fd, b"x" * (MAX_PENDING + 1)))


async def test_a_hand_over_whose_last_piece_never_comes_is_closed(monkeypatch):
    from appliance.workers import handoff

    monkeypatch.setattr(handoff, "_PARTIAL_TIMEOUT", 0.2)
    await _closed_unserved(lambda end, fd: socket.send_fds(end, [b"\x01first piece, more to come"], [fd]))
