"""The channel between the daemon and a model process: frames both ways across processes, frames larger
than a pipe holds, the end seen by each side, descriptors named on a command line; frames arriving in any
pieces (property-based), and a header that claims more than arrives."""

from __future__ import annotations

import itertools
import os
import struct
import subprocess
import sys
import textwrap
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.backends.python.wire.channel import CAPACITY, Channel

_ECHO = textwrap.dedent("""
    import sys
    from appliance.backends.python.wire.channel import Channel
    channel = Channel.from_argument(sys.argv[1])
    while True:
        try:
            frame = channel.recv_bytes()
        except EOFError:
            break
        channel.send_bytes(frame[::-1])
""")


@pytest.fixture
def echo():
    """A process that sends back every frame it gets, reversed, until its channel ends."""
    ours, theirs = Channel.pair()
    process = subprocess.Popen([sys.executable, "-c", _ECHO, Channel.argument(theirs)], pass_fds=theirs,
                               env={**os.environ, "PYTHONPATH": os.getcwd()})
    Channel.close_fds(theirs)
    yield ours, process
    ours.close()
    process.wait(10)


def test_frames_go_both_ways_in_order(echo):
    channel, _ = echo
    for index in range(200):
        channel.send_bytes(f"frame {index}".encode())
    assert [channel.recv_bytes() for _ in range(200)] == [f"frame {i}".encode()[::-1] for i in range(200)]


def test_a_frame_larger_than_the_pipe_arrives_whole(echo):
    channel, _ = echo
    frame = os.urandom(3 * CAPACITY + 17)
    channel.send_bytes(frame)  # the other side reads while this writes
    assert channel.recv_bytes() == frame[::-1]


def test_the_other_end_closing_is_the_end_of_the_channel_on_both_sides(echo):
    channel, process = echo
    channel.send_bytes(b"x")
    assert channel.recv_bytes() == b"x"
    process.kill()
    process.wait(10)
    with pytest.raises(EOFError):  # the daemon's side: the model process is gone
        channel.recv_bytes()
    with pytest.raises(OSError):  # nobody reads: a send fails instead of blocking
        channel.send_bytes(b"y")


def test_the_model_process_sees_the_end_when_the_daemon_closes_its_end(echo):
    channel, process = echo
    channel.close()
    assert process.wait(10) == 0  # its recv ended with EOFError, and it returned


def test_the_descriptors_travel_as_one_argument():
    ours, theirs = Channel.pair()
    try:
        assert Channel.argument(theirs) == f"{theirs[0]},{theirs[1]}"
        other = Channel.from_argument(Channel.argument(theirs))
        ours.send_bytes(b"ping")
        assert other.recv_bytes() == b"ping"
        other.send_bytes(b"pong")
        assert ours.recv_bytes() == b"pong"
        assert other.fds() == theirs and ours.fileno() == ours.fds()[0]
        other.close()
    finally:
        ours.close()


def _looped() -> tuple[Channel, Channel]:
    """Both ends in this process (the daemon's, the model process's): what one sends the other reads."""
    ours, theirs = Channel.pair()
    return ours, Channel(*theirs)


def test_a_frame_that_claims_more_than_arrives_is_an_error_not_an_allocation():
    ours, theirs = _looped()
    os.write(theirs.fds()[1], struct.pack("!i", -1) + struct.pack("!Q", 1 << 40) + b"only this")
    os.close(theirs.fds()[1])
    with pytest.raises(OSError, match="ended within a message"):  # read as it arrives, never 1 TiB at once
        ours.recv_bytes()
    ours.close()


@settings(max_examples=60, deadline=None)
@given(frames=st.lists(st.binary(max_size=2 * CAPACITY).map(bytes), max_size=6),
       pieces=st.lists(st.integers(1, 70_000), min_size=1, max_size=8))
def test_frames_written_in_any_pieces_are_read_whole_and_in_order(frames, pieces):
    """The header and body of each frame may arrive split anywhere (a pipe, a large frame, a signal)."""
    ours, theirs = _looped()
    wire = b"".join(struct.pack("!i", len(f)) + f for f in frames)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.extend(ours.recv_bytes() for _ in frames))
    reader.start()
    at, turn = 0, 0
    while at < len(wire):  # written in the given pieces, in turn
        size = pieces[turn % len(pieces)]
        os.write(theirs.fds()[1], wire[at:at + size])
        at, turn = at + size, turn + 1
    reader.join(30)
    assert received == frames
    ours.close()
    theirs.close()


@settings(max_examples=60, deadline=None)
@given(frames=st.lists(st.binary(max_size=2 * CAPACITY).map(bytes), max_size=6),
       pieces=st.lists(st.integers(1, 70_000), min_size=1, max_size=8))
def test_frames_filled_without_waiting_come_whole_in_order_whatever_the_pieces(frames, pieces):
    """The event loop's way (``fill`` once a wake-up, then ``next_frame``): a frame is given only once it is
    whole, every frame once and in order, however the bytes came; ``holds_frame`` says so beforehand. A
    read that is exactly one whole frame, nothing held before it, is that frame, from ``fill`` itself."""
    ours, theirs = _looped()
    ours.read_without_waiting()
    wire = b"".join(struct.pack("!i", len(f)) + f for f in frames)
    ends = set(itertools.accumulate((4 + len(f) for f in frames), initial=0))  # where a whole frame ends
    received: list[bytes] = []
    at, turn = 0, 0
    while at < len(wire):  # each piece fits in the pipe, and one fill() reads all of it
        size = min(pieces[turn % len(pieces)], 60_000)
        piece = wire[at:at + size]
        os.write(theirs.fds()[1], piece)
        at, turn = at + size, turn + 1
        alone = ours.all_taken and len(piece) > 4 and struct.unpack_from("!i", piece)[0] == len(piece) - 4
        read = ours.fill()
        if alone:
            assert read == piece[4:] and not ours.holds_frame
            received.append(read)
        else:
            assert read is True
        holds = ours.holds_frame
        frame = ours.next_frame()
        assert (frame is not None) == holds
        while frame is not None:
            received.append(frame)
            frame = ours.next_frame()
        assert ours.all_taken == (min(at, len(wire)) in ends)  # nothing of a next frame read yet
    assert ours.fill() is True  # nothing more: a wake-up for nothing is no end
    assert received == frames
    assert not ours.holds_frame and ours.next_frame() is None
    theirs.close()
    assert ours.fill() is False  # the other end closed
    ours.close()


def test_a_header_that_claims_more_than_arrives_holds_only_what_arrived():
    ours, theirs = _looped()
    ours.read_without_waiting()
    os.write(theirs.fds()[1], struct.pack("!i", -1) + struct.pack("!Q", 1 << 40) + b"only this")
    assert ours.fill()
    assert not ours.holds_frame and ours.next_frame() is None
    theirs.close()
    assert not ours.fill()
    ours.close()
