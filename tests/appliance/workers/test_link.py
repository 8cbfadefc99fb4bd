"""The daemon–worker link: messages arrive whole and in order however the stream splits them, a burst is
written at once, and a frame over the bound ends the link before anything is allocated for it."""

from __future__ import annotations

import asyncio
import pickle
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.workers.link import Link


class _Transport:
    """A transport that records what is written to it."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.aborted = False
        self.closed = False

    def writelines(self, pieces) -> None:
        self.writes.append(b"".join(pieces))

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.closed = True


def _frames(messages: list[tuple]) -> bytes:
    out = b""
    for message in messages:
        payload = pickle.dumps(message)
        out += struct.pack("<I", len(payload)) + payload
    return out


_MESSAGES = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 1 << 40), st.binary(max_size=3000),
                               st.one_of(st.none(), st.text(max_size=40))), max_size=12)


@settings(max_examples=150, deadline=None)
@given(messages=_MESSAGES, cuts=st.lists(st.integers(1, 5000), max_size=40))
def test_messages_split_anywhere_arrive_whole_and_in_order(messages, cuts):
    async def run() -> list[tuple]:
        got: list[tuple] = []
        link = Link(got.append)
        link.connection_made(_Transport())  # type: ignore[arg-type]
        stream = _frames(messages)
        at = 0
        for cut in cuts:
            link.data_received(stream[at:at + cut])
            at += cut
        link.data_received(stream[at:])
        return got

    assert asyncio.run(run()) == messages


async def test_a_burst_of_messages_sent_in_one_turn_is_one_write():
    transport = _Transport()
    link = Link(lambda message: None)
    link.connection_made(transport)  # type: ignore[arg-type]
    for n in range(5):
        link.send((3, n, [b"answer"], False))
    assert transport.writes == []
    await asyncio.sleep(0)
    assert len(transport.writes) == 1
    got: list[tuple] = []
    reader = Link(got.append)
    reader.connection_made(_Transport())  # type: ignore[arg-type]
    reader.data_received(transport.writes[0])
    assert got == [(3, n, [b"answer"], False) for n in range(5)]


async def test_a_frame_over_the_bound_ends_the_link_without_reading_it():
    transport = _Transport()
    got: list[tuple] = []
    link = Link(got.append, max_frame=1000)
    link.connection_made(transport)  # type: ignore[arg-type]
    link.data_received(_frames([(1, "fine")]) + struct.pack("<I", 0xFFFFFFFF) + b"x" * 10)
    assert got == [(1, "fine")] and transport.aborted
    link.data_received(b"more")  # after the abort, before connection_lost: nothing is kept
    assert got == [(1, "fine")]


async def test_a_link_whose_other_end_is_gone_drops_what_is_sent_and_says_it_is_closed():
    link = Link(lambda message: None)
    link.connection_made(_Transport())  # type: ignore[arg-type]
    link.connection_lost(None)
    link.send((1, 2))  # no error: nobody waits for it
    assert link.closed.done()


async def test_a_frame_that_names_a_class_or_is_no_pickle_ends_the_link():
    import os

    for payload in (pickle.dumps((1, os.system)), pickle.dumps(ValueError("x")), b"\x80\x05garbage"):
        transport = _Transport()
        got: list[tuple] = []
        link = Link(got.append)
        link.connection_made(transport)  # type: ignore[arg-type]
        link.data_received(_frames([(1, "fine")]) + struct.pack("<I", len(payload)) + payload)
        assert got == [(1, "fine")] and transport.aborted, payload
