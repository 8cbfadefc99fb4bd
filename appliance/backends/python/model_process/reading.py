"""Who reads the model process's end of the channel: the main thread or the reader thread.

The main thread runs the daemon's commands one at a time. While it waits for the next one it reads the
channel itself, so a command wakes it directly, not through another thread (a thread hop costs as much
as the whole round trip to the daemon). While it runs a command nobody reads, unless another thread
starts a call that needs an answer (BLS, ``is_cancelled``, a metric family), or sends a response whose
tensors are in a block that the daemon gives back (``Runtime.lent``): then the reader thread
takes over and keeps reading (commands it reads go to the main thread through a queue) until a command
passes without calls, when the main thread takes reading back through a wake-up pipe. A call the main
thread makes itself during a command and waits for (BLS ``exec``) is the exception: with nobody else
reading, the main thread reads until its answer is in (a thread hop less per call), then hands over to
the reader thread only if some other thread started a call meanwhile. Exactly one thread
reads at any time, so every message is read once and in order. A daemon that goes away while nobody
reads is noticed by PR_SET_PDEATHSIG, or when the command ends.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import threading
from collections.abc import Callable

from appliance.backends.python.model_process.pb.runtime import Runtime
from appliance.backends.python.wire.messages import (
    Describe,
    Execute,
    ExecuteEach,
    Finalize,
    Initialize,
    Message,
    MessageRefused,
    decode,
)

__all__ = ["COMMANDS", "Reading"]

COMMANDS = (Describe, Initialize, Execute, ExecuteEach, Finalize)
"""The daemon's commands, run one at a time by the main thread (every other message is handled where it is read)."""

log = logging.getLogger("appliance.python-stub")

_MAIN, _BUSY, _READER, _CALLER = "main", "busy", "reader", "caller"
"""Who reads: the main thread between commands; nobody (a command runs); the reader thread; the main
thread during a command, waiting for the answer to its own call."""


class Reading:
    def __init__(self, rt: Runtime, dispatch: Callable[[Message], None], gone: Callable[[], None]) -> None:
        """``dispatch``: handles a message that is not a command, on the thread that read it; ``gone``:
        the daemon closed the channel (never returns)."""
        self._rt = rt
        self._dispatch = dispatch
        self._gone = gone
        self._lock = threading.Lock()
        self._state = _MAIN
        self._called = False
        """A call was started during the current command."""
        self._others = False
        """Another thread started a call while the main thread read for its own."""
        self._main = threading.get_ident()
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._reader_turn = threading.Event()
        self._main_turn = threading.Event()
        self._wake_read, self._wake_write = os.pipe()
        rt.on_call = self.call_started
        rt.read_inline = self.read_until
        threading.Thread(target=self._read, name="pb-reader", daemon=True).start()

    def call_started(self, inline: bool = False) -> None:
        """Some thread waits for an answer: make sure a thread reads (any thread, before it sends).
        ``inline``: the caller will wait in ``read_until``, which reads itself where it may."""
        with self._lock:
            if inline and self._state == _BUSY and threading.get_ident() == self._main:
                self._state = _CALLER
                return
            self._called = True
            if self._state == _CALLER:  # the main thread reads for now; the reader follows it
                self._others = True
                return
            if self._state != _BUSY:
                return
            self._state = _READER
        self._reader_turn.set()

    def read_until(self, done: Callable[[], bool]) -> None:
        """The main thread, after starting an ``inline`` call: read (dispatching everything, queueing
        commands) until ``done()``; then nobody reads, unless another thread's call started meanwhile.
        Returns at once on any other thread, or when the reader thread reads."""
        with self._lock:
            if self._state != _CALLER or threading.get_ident() != self._main:
                return
        while not done():
            self._route(self._recv())
        with self._lock:
            others, self._others = self._others, False
            self._state = _READER if others else _BUSY
        if others:
            self._reader_turn.set()

    def next_command(self) -> Message:
        """Main thread: the next command, reading (and dispatching what else comes) while it waits."""
        with self._lock:
            reclaim = self._state == _READER and not self._called
            if self._state in (_BUSY, _CALLER):  # _CALLER: a call whose sending failed never reached read_until
                self._state = _MAIN
                self._others = False
            self._called = False
        if reclaim:  # the last command made no call: the reader thread hands reading back
            self._main_turn.clear()
            os.write(self._wake_write, b"x")
            self._main_turn.wait()
        while True:
            with self._lock:
                reading = self._state == _MAIN
            if not reading:  # the reader thread reads on: its commands come through the queue
                message = self._commands.get()
            elif self._commands.empty():  # (asked first: an Empty raised for every command costs ~1 µs)
                message = self._recv()
            else:
                message = self._commands.get_nowait()  # read by the reader thread before it handed back
            if isinstance(message, COMMANDS):
                with self._lock:
                    if self._state == _MAIN:
                        self._state = _BUSY
                return message
            self._dispatch(message)

    def _recv(self) -> Message:
        try:
            data = self._rt.conn.recv_bytes()
        except (EOFError, OSError):
            self._gone()
            raise
        try:
            return decode(data)
        except MessageRefused as exc:  # another version of the daemon: nothing it sends can be trusted
            log.error("the daemon sent a frame that is not a message; this model process exits: %s", exc.message)
            self._gone()
            raise

    def _read(self) -> None:
        conn = self._rt.conn.fileno()
        while True:
            self._reader_turn.wait()
            self._reader_turn.clear()
            while True:
                if self._rt.conn.holds_frame:  # read together with one before: no wait on the pipe for it
                    self._route(self._recv())
                    continue
                ready, _, _ = select.select([self._wake_read, conn], [], [])
                if self._wake_read in ready:
                    os.read(self._wake_read, 64)
                    with self._lock:
                        self._state = _MAIN
                    self._main_turn.set()
                    break
                self._route(self._recv())

    def _route(self, message: Message) -> None:
        """A message read while the main thread is not waiting for a command: a command is queued for it
        (``next_command``), anything else is handled at once on this thread."""
        if isinstance(message, COMMANDS):
            self._commands.put(message)
        else:
            self._dispatch(message)
