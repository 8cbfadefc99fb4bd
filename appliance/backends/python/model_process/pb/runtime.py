"""The model process's end of the channel to the daemon, as pb_utils calls see it.

One per model process (Triton's stub is a process-wide singleton too): the stub installs it at start,
before model.py is imported. A model the daemon runs in its own process (the in-process plan) has one
of its own, current on the thread that runs its initialize/execute/finalize (``serving``). Any thread
may send; ``ask`` waits for the daemon's answer to one
question, ``start_call`` opens a call whose answers (one, or a stream) go to a callback.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from appliance.backends.python.model_process.pb.errors import TritonModelException
from appliance.backends.python.wire.arena import Attachments, Blocks
from appliance.backends.python.wire.channel import Channel
from appliance.backends.python.wire.messages import Answer, Ask, Free, Gone, Message, Result, encode

__all__ = ["Runtime", "current", "install", "serving"]

log = logging.getLogger("appliance.python-stub")


class Runtime:
    def __init__(self, conn: Channel, model_name: str) -> None:
        self.conn = conn
        self.model_name = model_name
        self.blocks = Blocks(model_name)
        """Where this process writes the tensors of streamed responses and BLS requests."""
        self.attachments = Attachments()
        """The daemon's blocks (BLS responses), as this process reads them."""
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._calls: dict[int, Callable[[Answer | Result | Gone], bool]] = {}
        self._calls_lock = threading.Lock()
        self._released: list[int] = []
        self._released_lock = threading.Lock()
        self.on_call: Callable[[bool], None] | None = None
        """Told when a call starts (before its request is sent), so that some thread reads its answers;
        True when the calling thread will wait for the answer in ``wait_inline``."""
        self.read_inline: Callable[[Callable[[], bool]], None] | None = None
        """Reads the channel on the calling thread until the condition holds, where that thread may read."""

    def send(self, message: Message) -> None:
        data = encode(message)
        with self._send_lock:
            self.conn.send_bytes(data)

    def lent(self) -> None:
        """A message about to be sent holds a block of this process's: some thread must read, so that the
        daemon's ``Free`` of it comes back (a model streaming large responses during one execute() would
        otherwise fill segment after segment). Small tensors travel in their message and lend nothing."""
        if self.on_call is not None:
            self.on_call(False)

    def release(self, block: int, now: bool = False) -> None:
        """The daemon may reuse one of its blocks (its tensors were copied out). Told with the next BLS call
        or after the next execute(), not at once: a message less on every call's path; ``now`` for a
        block whose segment (an oversized one) the daemon removes as soon as it is free."""
        with self._released_lock:
            self._released.append(block)
            if len(self._released) < _RELEASE_BATCH and not now:
                return
            blocks, self._released = self._released, []
        self.send(Free(blocks))

    def take_released(self) -> list[int]:
        with self._released_lock:
            blocks, self._released = self._released, []
        return blocks

    def flush_released(self) -> None:
        blocks = self.take_released()
        if blocks:
            self.send(Free(blocks))

    def start_call(self, on_answer: Callable[[Answer | Result | Gone], bool], inline: bool = False) -> int:
        """A new call id; ``on_answer(message)`` gets each answer (Answer, Result) and returns True on the
        last one. If the daemon goes away first, it gets ``Gone``. ``inline``: the calling thread
        then waits for the answer in ``wait_inline``."""
        call = next(self._ids)
        with self._calls_lock:
            self._calls[call] = on_answer
        if self.on_call is not None:
            self.on_call(inline)
        return call

    def wait_inline(self, done: Callable[[], bool]) -> None:
        """After an ``inline`` call is sent: where this thread may read the channel (the stub's main thread
        running a command, with nobody else reading), it reads until ``done()``, so the answer wakes it
        directly rather than through the reader thread; otherwise it returns at once, to wait as usual."""
        if self.read_inline is not None:
            self.read_inline(done)

    def ask(self, what: str, *args: Any, timeout: float | None = None) -> Any:
        """Ask the daemon one question and wait for the answer (raises what the daemon reports)."""
        future: Future = Future()

        def answered(message: Answer | Result | Gone) -> bool:
            match message:
                case Answer(_, True, value):
                    future.set_result(value)
                case Answer(_, _, error) | Gone(_, error):
                    future.set_exception(TritonModelException(error))
                case _:
                    future.set_exception(TritonModelException(f"the server answered {what} with "
                                                              f"{type(message).__name__}"))
            return True

        call = self.start_call(answered)
        self.send(Ask(call, what, args))
        return future.result(timeout)

    def answer(self, message: Message) -> None:
        """Route an answer (Answer or Result) to its call (reader thread)."""
        if not isinstance(message, (Answer, Result)):
            log.error("the daemon sent a %s message, which answers no call; dropped", type(message).__name__)
            return
        call = message.call
        with self._calls_lock:
            handler = self._calls.get(call)
        if handler is not None and handler(message):
            with self._calls_lock:
                self._calls.pop(call, None)

    def fail_calls(self, reason: str) -> None:
        """The daemon went away: every open call gets an error answer."""
        with self._calls_lock:
            calls = list(self._calls.items())
            self._calls.clear()
        for call, handler in calls:
            handler(Gone(call, reason))

    def close(self) -> None:
        self.blocks.close()
        self.attachments.close()


_RELEASE_BATCH = 64
_current: Runtime | None = None
_local = threading.local()


def install(runtime: Runtime) -> None:
    global _current
    _current = runtime


class serving:  # noqa: N801 - used as a function: ``with serving(runtime):``
    """``runtime`` is current on this thread while the block runs (a model served in the daemon; a
    class rather than a generator, as every batch enters one)."""

    __slots__ = ("_runtime", "_previous")

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._previous: Runtime | None = None

    def __enter__(self) -> None:
        self._previous = getattr(_local, "runtime", None)
        _local.runtime = self._runtime

    def __exit__(self, *exc_info: object) -> None:
        _local.runtime = self._previous


def current() -> Runtime:
    local = getattr(_local, "runtime", None)
    if local is not None:
        return local
    if _current is None:
        raise TritonModelException(
            "this call needs the server: it works only inside a model.py that the server runs"
        )
    return _current
