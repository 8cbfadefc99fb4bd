"""The appliance's daemon with a bytecode counter on its event loop's thread: bench.bytecodes' wrapper.

    python bench/bytecode_daemon.py <python> -m appliance serve ...   (start_appliance's command, wrapped)
    python bench/bytecode_daemon.py <python> -m bench.lean_reference ...   (the reference's, likewise)

Runs ``appliance`` in this process, as ``python -m`` would (the working directory first on the path, in
place of this file's directory, so a baseline checkout's daemon is that checkout's). SIGUSR1 starts
counting: every Python frame the main thread enters from then on is traced with ``f_trace_opcodes``, and
each bytecode and each call is counted by its code object (one made from a string, as a dataclass's
``__init__`` is, named by the class it was first called on). SIGUSR2 stops and writes the counts, as JSON,
to the file ``BENCH_BYTECODES_OUT`` names. The tracer makes the daemon some thirty times slower: what it
measures is how many bytecodes a request runs, never how long they take. Threads other than the main one
(the metrics writer, the model process's reader before the hand-over) are not traced.
"""

from __future__ import annotations

import collections
import json
import os
import runpy
import signal
import sys
from types import CodeType, FrameType
from typing import Any

_bytecodes: collections.Counter[CodeType] = collections.Counter()
_calls: collections.Counter[CodeType] = collections.Counter()
_owners: dict[CodeType, str] = {}
"""The class of each method made from a string (a dataclass's ``__init__``, whose qualified name says only
``__create_fn__``), seen on its first call: what the counts name it by."""


def _local(frame: FrameType, event: str, arg: Any) -> Any:
    if event == "opcode":
        _bytecodes[frame.f_code] += 1
    return _local


def _global(frame: FrameType, event: str, arg: Any) -> Any:
    code = frame.f_code
    _calls[code] += 1
    if code.co_filename == "<string>" and code not in _owners and "self" in frame.f_locals:
        _owners[code] = type(frame.f_locals["self"]).__qualname__
    frame.f_trace_opcodes = True
    return _local


def _start(*_: object) -> None:
    _bytecodes.clear()
    _calls.clear()
    sys.settrace(_global)


def _stop(*_: object) -> None:
    sys.settrace(None)
    rows = [[code.co_filename, code.co_firstlineno, _name(code), _bytecodes.get(code, 0), _calls.get(code, 0)]
            for code in _bytecodes.keys() | _calls.keys()]
    with open(os.environ["BENCH_BYTECODES_OUT"], "w") as out:
        json.dump(rows, out)


def _name(code: CodeType) -> str:
    """``code``'s qualified name; a method made from a string, by its class (``Pending.__init__``)."""
    owner = _owners.get(code)
    return code.co_qualname if owner is None else f"{owner}.{code.co_name}"


_SERVERS = ("appliance", "bench.lean_reference")
"""The modules it runs: the daemon, and the lean reference (``bench.bytecodes --reference``)."""


def run_traced(argv: list[str]) -> None:
    """``argv``: the server's command line, ``<python> -m appliance <arguments>`` (start_appliance's) or
    ``<python> -m bench.lean_reference <arguments>`` (start_lean_reference's)."""
    if len(argv) < 3 or argv[1] != "-m" or argv[2] not in _SERVERS:
        raise SystemExit(f"expected '<python> -m appliance ...' or '<python> -m bench.lean_reference ...', "
                         f"got {argv[:3]}")
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
    sys.path[0] = os.getcwd()  # as ``python -m`` has it (not bench/, whose modules would shadow others)
    sys.argv = [argv[2], *argv[3:]]
    runpy.run_module(argv[2], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    run_traced(sys.argv[1:])
