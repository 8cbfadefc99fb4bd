"""Who reads the model process's end of the channel (appliance.backends.python.model_process.reading), driven from
this test as the daemon: the main thread reads for its own call while it waits (no thread hop), and
hands reading to the reader thread when another thread's call is still open."""

from __future__ import annotations

import threading

import pytest

from appliance.backends.python.model_process.pb.runtime import Runtime
from appliance.backends.python.model_process.reading import Reading
from appliance.backends.python.wire.channel import Channel
from appliance.backends.python.wire.messages import Answer, Execute, Message, decode, encode


class _Stub:
    """The model process's side on this thread (the 'main thread'), the daemon's end beside it."""

    def __init__(self) -> None:
        self.daemon, fds = Channel.pair()
        self.rt = Runtime(Channel(*fds), "m")
        self.reading = Reading(self.rt, self.rt.answer, self._gone)

    @staticmethod
    def _gone() -> None:
        """The stub exits here; the test's reader thread (a daemon thread) just stops reading."""
        threading.Event().wait()

    def send(self, message: Message) -> None:
        """As the daemon."""
        self.daemon.send_bytes(encode(message))

    def received(self) -> Message:
        """What the model process sent, as the daemon reads it."""
        return decode(self.daemon.recv_bytes())

    def call(self, inline: bool) -> tuple[int, dict]:
        """Start a call; its answer's value and the thread that read it land in the dict."""
        seen: dict = {}
        done = threading.Event()

        def answered(message: Answer) -> bool:
            seen["value"], seen["thread"] = message.value, threading.current_thread().name
            done.set()
            return True

        seen["done"] = done
        return self.rt.start_call(answered, inline), seen

    def close(self) -> None:
        self.daemon.close()


@pytest.fixture
def stub():
    made = _Stub()
    yield made
    made.close()


def test_the_main_thread_reads_for_its_own_call_and_queues_the_commands_it_meets(stub):
    stub.send(Execute({}, [1]))
    assert stub.reading.next_command() == Execute({}, [1])  # a command runs: nobody reads
    call, seen = stub.call(inline=True)
    stub.send(Execute({}, [2]))  # pipelined behind the answer: read while waiting, kept for later
    stub.send(Answer(call, True, 42))
    stub.rt.wait_inline(seen["done"].is_set)
    assert seen["value"] == 42 and seen["thread"] == threading.current_thread().name  # no reader thread
    assert stub.reading.next_command() == Execute({}, [2])


def test_another_threads_call_is_read_by_the_reader_thread_once_the_main_thread_has_its_answer(stub):
    stub.send(Execute({}, [1]))
    stub.reading.next_command()
    mine, seen_mine = stub.call(inline=True)
    other: dict = {}
    started = threading.Thread(target=lambda: other.update(zip(("call", "seen"), stub.call(inline=False))))
    started.start()
    started.join(5)
    stub.send(Answer(mine, True, "mine"))
    stub.rt.wait_inline(seen_mine["done"].is_set)
    assert seen_mine["value"] == "mine"
    stub.send(Answer(other["call"], True, "other"))  # nobody on the main thread reads now
    assert other["seen"]["done"].wait(5)
    assert other["seen"]["value"] == "other" and other["seen"]["thread"] == "pb-reader"


def test_a_call_from_another_thread_never_reads_inline(stub):
    stub.send(Execute({}, [1]))
    stub.reading.next_command()
    result: dict = {}

    def elsewhere() -> None:
        call, seen = stub.call(inline=True)  # asks for inline, but this is not the main thread
        result["call"] = call
        stub.rt.wait_inline(seen["done"].is_set)  # returns at once
        result["seen"] = seen

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join(5)
    assert not result["seen"]["done"].is_set()
    stub.send(Answer(result["call"], True, 7))
    assert result["seen"]["done"].wait(5) and result["seen"]["thread"] == "pb-reader"


def test_the_main_thread_takes_reading_back_for_the_next_command_after_an_inline_call(stub):
    stub.send(Execute({}, [1]))
    stub.reading.next_command()
    call, seen = stub.call(inline=True)
    stub.send(Answer(call, True, 1))
    stub.rt.wait_inline(seen["done"].is_set)
    stub.send(Execute({}, [2]))
    assert stub.reading.next_command() == Execute({}, [2])


def test_frames_that_came_in_one_write_are_each_read_whoever_reads(stub):
    """Frames read together (one read takes what the pipe holds) wait in the channel, not in the pipe: the
    reader thread takes them without waiting for the pipe to wake it, and so does the main thread."""
    stub.send(Execute({}, [1]))
    stub.reading.next_command()
    other: dict = {}
    thread = threading.Thread(target=lambda: other.update(zip(("call", "seen"), stub.call(inline=False))))
    thread.start()
    thread.join(5)
    second: dict = {}
    thread = threading.Thread(target=lambda: second.update(zip(("call", "seen"), stub.call(inline=False))))
    thread.start()
    thread.join(5)
    frames = [encode(Answer(other["call"], True, "first")), encode(Answer(second["call"], True, "second")),
              encode(Execute({}, [2]))]
    stub.daemon._write(b"".join(len(frame).to_bytes(4, "big") + frame for frame in frames))  # one write
    assert other["seen"]["done"].wait(5) and second["seen"]["done"].wait(5)
    assert (other["seen"]["value"], second["seen"]["value"]) == ("first", "second")
    assert stub.reading.next_command() == Execute({}, [2])
