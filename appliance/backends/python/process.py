"""One running model.py process, seen from the daemon: its start, its channel and its end.

The channel is multiplexed: the model process answers the daemon's commands (describe, initialize,
execute, finalize) in order, and in between, from any of its threads, sends messages of its own:
streamed responses of decoupled models, BLS calls, log records, metric updates. A reader thread
receives everything until ``read_on`` hands the channel to the event loop (then a reply or a call wakes
the loop itself); replies go, in the order the commands were sent, to the caller waiting in ``call`` or
to the callback of ``call_async`` (several commands may be on their way at once: the model process runs
them in order), every other kind to the handler registered for it. Sending is serialized by a lock, so
any thread may send.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from appliance.backends.base import LoadContext
from appliance.backends.python.environment import ModelEnvironment
from appliance.backends.python.wire.arena import Arena
from appliance.backends.python.wire.channel import Channel
from appliance.backends.python.wire.messages import (
    Crashed,
    Described,
    Done,
    Failed,
    Finalize,
    Finalized,
    HandedOver,
    Handover,
    Message,
    MessageRefused,
    Ready,
    decode,
    encode,
)
from appliance.core.errors import ConfigError, InferenceFailed

__all__ = ["REPLIES", "Handler", "ModelProcess", "ProcessExited"]

log = logging.getLogger(__name__)

REPLIES = (Described, Ready, Done, Failed, Finalized, Crashed)
"""The kinds that answer a command of the daemon (everything else is a message of the model's own)."""

Handler = Callable[[Any], "Awaitable[object] | None"]
"""Handles one kind of message; on the event loop it may hand back a wait (a client behind in reading a
streamed response), and the channel is read no further until it completes."""
_DRAIN = 16
"""Messages read in one wake-up of the event loop at most (the loop's other work waits meanwhile)."""
_OUTPUT_ARENAS = 3
"""Output arenas kept attached: the two a model process answers from in turn (see stub.serve), and the
one a grown arena replaced."""


class ProcessExited(InferenceFailed):
    """The model process ended while the daemon waited for it."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.code = code


class _Spawner:
    """Model processes are started from one long-lived thread: PR_SET_PDEATHSIG, which the stub sets,
    fires when the *thread* that forked it ends, so that thread must live as long as the daemon."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def spawn(self, args: list[str], pass_fds: tuple[int, ...], env: Mapping[str, str]) -> subprocess.Popen:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="python-model-spawner", daemon=True)
                self._thread.start()
        done: queue.SimpleQueue = queue.SimpleQueue()
        self._jobs.put((args, pass_fds, dict(env), done))
        result = done.get()
        if isinstance(result, BaseException):
            raise result
        return result

    def _serve(self) -> None:
        while True:
            args, pass_fds, env, done = self._jobs.get()
            try:
                done.put(subprocess.Popen(args, pass_fds=pass_fds, env=env))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                done.put(exc)


_SPAWNER = _Spawner()


class ModelProcess:
    """A model.py process and the reader thread that dispatches what it sends."""

    def __init__(self, context: LoadContext, handlers: Mapping[type[Message], Handler],
                 environment: ModelEnvironment | None = None) -> None:
        """``environment``: the model's own Python environment (EXECUTION_ENV_PATH), else the daemon's."""
        self.name = context.model_name
        self.conn, child = Channel.pair()
        env = environment.process_environment(os.environ) if environment is not None else dict(os.environ)
        if context.threads:
            env["OMP_NUM_THREADS"] = str(context.threads)
        python = str(environment.python) if environment is not None else sys.executable
        args = [python, "-m", "appliance.backends.python.model_process.stub", Channel.argument(child),
                str(context.model_file), str(os.getpid())]
        try:
            self.process = _SPAWNER.spawn(args, child, env)
        except BaseException:
            self.conn.close()
            raise
        finally:
            Channel.close_fds(child)
        self._send_lock = threading.Lock()
        self._waiting: collections.deque[Callable[[Message | None], None]] = collections.deque()
        """Where the replies to the commands sent go, oldest first (None: the process ended first)."""
        self._reply_lock = threading.Lock()
        self._ended = False
        self._handlers = dict(handlers)
        self._closed_handlers: list[Callable[[], None]] = []
        self._output_arenas: dict[str, Arena] = {}
        """The model process's output arenas, attached, oldest first."""
        self.exit_code: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_loop = False
        """The event loop reads the channel (after ``read_on``), not the reader thread."""
        self._resuming: asyncio.Task | None = None
        """While the loop holds back reading (a handler waits for a client): what resumes it."""
        self._ended_event = threading.Event()
        self._ending = False
        self._pidfd: int | None = None
        """Readable once the process has exited, watched by the loop (``read_on``): ``alive`` then asks no
        system call (a ``waitpid`` a request, before)."""
        self._exited = False
        self._reader = threading.Thread(target=self._read, name=f"python-model-reader:{self.name}", daemon=True)
        self._reader.start()

    # -- sending and receiving ---------------------------------------------------------------

    def send(self, message: Message) -> None:
        """Send from any thread; a process that is gone makes this a no-op (its end is reported by
        the reader)."""
        data = encode(message)
        try:
            with self._send_lock:
                self.conn.send_bytes(data)
        except (OSError, ValueError):
            pass

    def _command(self, message: Message, on_reply: Callable[[Message | None], None]) -> bool:
        """Send a command whose reply goes to ``on_reply``; False if the process has ended (nobody would
        answer). The queue of waiters and the channel take commands in the same order."""
        data = encode(message)  # (encoded before the lock; sent as ``send`` sends, without its call)
        with self._reply_lock:
            if self._ended:
                return False
            self._waiting.append(on_reply)
            try:
                with self._send_lock:
                    self.conn.send_bytes(data)
            except (OSError, ValueError):  # gone: its end, read next, answers the waiter with None
                pass
        return True

    def call(self, message: Message, doing: str = "handling the request") -> Message:
        """Send a command and wait for its reply; ``doing`` names the step in the error if the process
        ends meanwhile."""
        box: queue.SimpleQueue = queue.SimpleQueue()
        reply = box.get() if self._command(message, box.put) else None
        if reply is None:
            code = self.process.wait()
            raise ProcessExited(f"the model process of '{self.name}' exited with code {code} while {doing}", code)
        if isinstance(reply, Crashed):
            raise ConfigError(f"model.py of '{self.name}' failed: {reply.what}\n{reply.traceback}")
        return reply

    def call_async(self, message: Message, on_reply: Callable[[Message | None], None]) -> None:
        """Send a command without waiting: ``on_reply`` gets its reply on whatever reads the channel (None
        if the process ended first). Commands are answered in the order they were sent."""
        if not self._command(message, on_reply):  # the reader has stopped: nobody would answer
            on_reply(None)

    def on_exit(self, callback: Callable[[], None]) -> None:
        """Called (on the reader thread) once the process is gone."""
        self._closed_handlers.append(callback)

    def read_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """From now on the event loop reads the channel (call on its thread): a reply wakes the loop
        itself, not a thread that must then wake it. The reader thread hands over at a marker the
        model process echoes, so that every message is read exactly once, in order."""
        if self._loop is not None:
            return
        self._loop = loop
        self._watch_exit(loop)
        self.send(Handover())

    def _watch_exit(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.process.returncode is not None:  # reaped already (its pid may be another process's now)
            return
        try:
            pidfd = os.pidfd_open(self.process.pid)
        except (AttributeError, OSError):  # not Linux 5.3 or later: ``alive`` asks ``poll``
            return
        self._pidfd = pidfd
        loop.add_reader(pidfd, self._process_exited)

    def _process_exited(self) -> None:
        """The pidfd is readable: the process has exited (on the loop, or from ``stop`` once it is not
        running)."""
        self._exited = True
        pidfd, self._pidfd = self._pidfd, None
        if pidfd is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(pidfd)
        os.close(pidfd)

    @property
    def handed_over(self) -> bool:
        """``read_on`` has been asked (it may not have taken effect yet: ``reads_on_loop``)."""
        return self._loop is not None

    @property
    def reads_on_loop(self) -> bool:
        """The event loop reads the channel (``read_on`` has taken effect), not the reader thread."""
        return self._on_loop

    def _read(self) -> None:
        try:
            while True:
                try:
                    data = self.conn.recv_bytes()
                except (EOFError, OSError):
                    break
                message = self._decode(data)
                if message is None:
                    continue
                if isinstance(message, HandedOver) and self._loop is not None:
                    try:
                        self._loop.call_soon_threadsafe(self._read_on_loop)
                    except RuntimeError:  # the loop is closed: read on here
                        continue
                    return
                self._dispatch(message)
        except BaseException:
            self._end()
            raise
        self._end()

    def _read_on_loop(self) -> None:
        assert self._loop is not None
        self.conn.read_without_waiting()
        self._loop.add_reader(self.conn.fileno(), self._readable)
        self._on_loop = True
        if self.conn.holds_frame:  # read by the reader thread with the handover's echo
            self._take()

    def _readable(self) -> None:
        """The channel is readable (on the event loop): one read takes what it holds. A read of one reply
        alone (the common one) is answered here; anything else goes through ``_take``."""
        try:
            read = self.conn.fill()
        except OSError:
            read = False
        if type(read) is bytes:
            message = self._decode(read)
            if isinstance(message, REPLIES):
                self._reply(message)
                return
            if message is not None and not self._handled(message):
                return
            read = True
        self._take(ended=not read)

    def _take(self, ended: bool = False) -> None:
        """The messages read, up to ``_DRAIN`` a turn of the loop (the responses a decoupled model sent
        meanwhile are handled in one turn, so their answers leave in one write); then, if the other end
        closed (``ended``), the end."""
        assert self._loop is not None
        if not self._on_loop or self.conn.closed:  # stopped since this turn was asked for
            return
        conn = self.conn
        for _ in range(_DRAIN):
            data = conn.next_frame()
            if data is None:
                break
            message = self._decode(data)
            if message is not None and not self._handled(message):
                return
            if conn.all_taken:  # (the common read: one reply, and no second look for another)
                break
        else:
            if self.conn.holds_frame:  # more than a turn's worth read already: the next turn takes them
                self._loop.call_soon(self._take, ended)
                return
        if ended:
            self._loop.remove_reader(self.conn.fileno())
            self._on_loop = False
            # Ending waits for the process: never on the event loop.
            threading.Thread(target=self._end, name=f"python-model-end:{self.name}", daemon=True).start()

    def _handled(self, message: Message) -> bool:
        """``message`` dispatched; False when reading stops for this turn: its handler holds back what follows
        (in order) until it is done with it, or the channel stopped meanwhile."""
        waiting = self._dispatch(message)
        if waiting is not None:
            assert self._loop is not None
            self._loop.remove_reader(self.conn.fileno())
            self._resuming = self._loop.create_task(self._resume_after(waiting))
            return False
        return self._on_loop and not self.conn.closed

    async def _resume_after(self, waiting: Awaitable[object]) -> None:
        try:
            await waiting
        except Exception:
            log.exception("model %s: handling its message failed", self.name)
        self._resuming = None
        with self._reply_lock:  # against stop() ending the channel meanwhile (_claim_held_end)
            if self._on_loop and not self._ending and not self.conn.closed:
                assert self._loop is not None
                self._loop.add_reader(self.conn.fileno(), self._readable)
                if self.conn.holds_frame:  # read before the hold, and the pipe may wake nobody for them
                    self._loop.call_soon(self._take)

    def _claim_held_end(self) -> bool:
        """Stopping (off the loop) while the loop holds back reading: it would not read the end, so the
        stopping thread takes the end over, and the loop reads this channel no more."""
        with self._reply_lock:
            if self._resuming is None or self._ending:
                return False
            self._ending = True
        return True

    def _decode(self, data: bytes) -> Message | None:
        """The message in a frame, or None for one that is not a message: the process is killed (what it
        sent may have been a reply someone waits for), and its end, read next, fails what waits for it."""
        try:
            return decode(data)
        except MessageRefused as exc:
            log.error("model %s sent a frame that is not a message, so its process is stopped: %s", self.name,
                      exc.message)
            self.kill_now()
            return None

    def _dispatch(self, message: Message) -> Awaitable[object] | None:
        if isinstance(message, REPLIES):
            self._reply(message)
            return None
        handler = self._handlers.get(type(message))
        if handler is None:
            log.error("model %s sent a message the daemon does not take: %s", self.name, type(message).__name__)
            return None
        try:
            return handler(message)
        except Exception:
            log.exception("model %s: handling its %s message failed", self.name, type(message).__name__)
            return None

    def _end(self, claimed: bool = False) -> None:
        """``claimed``: the caller has set ``_ending`` already (``_claim_held_end``)."""
        if not claimed:
            with self._reply_lock:
                if self._ending:  # the loop's end thread and stop() may both get here
                    return
                self._ending = True
        try:
            self._reply(None)
            for callback in self._closed_handlers:
                try:
                    callback()
                except Exception:
                    log.exception("model %s: cleaning up after its process failed", self.name)
        finally:
            self._ended_event.set()

    def _reply(self, message: Message | None) -> None:
        with self._reply_lock:
            if message is None:  # the end: every command still waiting gets None
                self._ended = True
                waiting: Sequence[Callable[[Message | None], None]] = list(self._waiting)
                self._waiting.clear()
            elif self._waiting:  # the common reply: its one waiter
                waiting = (self._waiting.popleft(),)
            else:  # e.g. finalize's answer at stop: nobody waits for it
                log.debug("model %s: reply %s with no command waiting", self.name, type(message).__name__)
                return
        for on_reply in waiting:
            try:
                on_reply(message)
            except Exception:
                log.exception("model %s: handling its reply failed", self.name)

    # -- arenas ------------------------------------------------------------------------------

    def outputs(self, info: dict) -> Arena:
        """The process's output arena of an execute reply (it answers from two in turn; one that grew
        replaces the one it grew from)."""
        arena = self._output_arenas.get(info["path"])
        if arena is None:
            arena = self._output_arenas[info["path"]] = Arena.attach(info["path"], info["size"])
            while len(self._output_arenas) > _OUTPUT_ARENAS:
                self.drop_output_arena(next(iter(self._output_arenas)))
        return arena

    def drop_output_arena(self, path: str) -> None:
        """Unmap an output arena and remove its file: the model process leaves an oversized one to the
        daemon, which reads it last, and one that dies removes nothing."""
        arena = self._output_arenas.pop(path, None)
        if arena is None:
            return
        arena.close()
        try:  # the model process made it; remove it in case that process cannot
            os.unlink(arena.path)
        except FileNotFoundError:
            pass

    # -- the end -----------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        # poll() says None while another thread waits for the process (the reader, reaping a process
        # that died): the end of the channel, seen first, settles it. Not the channel's end alone: a
        # model's forked workers may hold the channel open after the process itself has died.
        if self._ending or self._exited:
            return False
        if self._pidfd is not None:  # the loop learns of the exit
            return True
        return self.process.poll() is None

    @property
    def pid(self) -> int:
        return self.process.pid

    def request_stop(self) -> None:
        """Ask model.py to finalize and exit once it is done with what it runs (never blocks)."""
        self.send(Finalize())

    def stop(self, timeout: float = 5.0) -> None:
        """Ask model.py to finalize and exit; kill the process if it has not within ``timeout``."""
        if self.process.poll() is None:
            self.send(Finalize())
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("model %s: its process did not finish within %.0f s; killing it", self.name, timeout)
                self.process.kill()
                self.process.wait()
        self.exit_code = self.process.returncode
        self._reader.join(timeout=5)
        loop = self._loop
        if self._pidfd is not None and (loop is None or not loop.is_running() or asyncio._get_running_loop() is loop):
            self._process_exited()  # (else the running loop reads the exit, and closes the pidfd)
        if loop is not None and not self._ended_event.is_set():
            if asyncio._get_running_loop() is loop or not loop.is_running():
                # Stopped from the loop that reads the channel (it cannot read the end while blocked
                # here), or with that loop stopped: nobody else will read the end, so it ends here.
                if self._on_loop and not loop.is_closed():
                    loop.remove_reader(self.conn.fileno())
                self._on_loop = False
                self._end()
            elif self._claim_held_end():
                self._end(claimed=True)
            elif not self._ended_event.wait(5):
                self._forget_reader()
                self._end()
        self.conn.close()
        for path in list(self._output_arenas):
            self.drop_output_arena(path)

    def _forget_reader(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            if loop.is_running():
                asyncio.run_coroutine_threadsafe(self._remove_reader(), loop).result(5)
            else:
                loop.remove_reader(self.conn.fileno())
        except (RuntimeError, TimeoutError, OSError, ValueError):
            log.warning("model %s: could not stop the event loop reading its channel", self.name)

    async def _remove_reader(self) -> None:
        assert self._loop is not None
        self._loop.remove_reader(self.conn.fileno())

    def kill_now(self) -> None:
        """Kill the process without waiting for it (its end reaches the reader as the channel's end)."""
        try:
            self.process.kill()
        except OSError:  # reaped already
            pass

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
