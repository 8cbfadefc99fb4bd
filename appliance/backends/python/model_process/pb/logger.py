"""``pb_utils.Logger``: model log records go to the daemon's log (logger ``appliance.model.<name>``)."""

from __future__ import annotations

import enum
import logging
import os
import sys
from collections.abc import Callable

from appliance.backends.python.model_process.pb import runtime
from appliance.backends.python.model_process.pb.runtime import Runtime
from appliance.backends.python.wire.messages import Log

__all__ = ["LogLevel", "Logger", "forward_logging"]


class LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_TO_LOGGING = {LogLevel.INFO: logging.INFO, LogLevel.WARNING: logging.WARNING, LogLevel.ERROR: logging.ERROR,
               LogLevel.VERBOSE: logging.DEBUG}


def _where(depth: int) -> tuple[str, int]:
    frame = sys._getframe(depth)
    return os.path.basename(frame.f_code.co_filename), frame.f_lineno


def _send(level: int, message: str, depth: int = 3) -> None:
    filename, line = _where(depth)
    try:
        runtime.current().send(Log(level, str(message), filename, line))
    except Exception:  # noqa: BLE001 - outside a server (or it went away): stderr is all there is
        print(f"{logging.getLevelName(level)} {filename}:{line}] {message}", file=sys.stderr)


def _at(level: int) -> Callable[[str], None]:
    def log(message: str) -> None:
        _send(level, message)

    return log


class Logger:
    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        _send(_TO_LOGGING[LogLevel(level)], message)

    log_info = staticmethod(_at(logging.INFO))
    log_warn = staticmethod(_at(logging.WARNING))
    log_error = staticmethod(_at(logging.ERROR))
    log_verbose = staticmethod(_at(logging.DEBUG))


class _Forward(logging.Handler):
    """The model process's own ``logging`` records (model.py's, the stub's) into the daemon's log."""

    def __init__(self, rt: Runtime) -> None:
        super().__init__()
        self._rt = rt

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._rt.send(Log(record.levelno, self.format(record), record.filename, record.lineno))
        except Exception:  # noqa: BLE001 - logging must never raise into the model
            self.handleError(record)


def forward_logging(rt: Runtime) -> None:
    root = logging.getLogger()
    root.handlers[:] = [_Forward(rt)]
    root.setLevel(logging.INFO)


# Triton spells the levels pb_utils.Logger.LogLevel.INFO and pb_utils.Logger.INFO as well.
setattr(Logger, "LogLevel", LogLevel)  # noqa: B010
for _level in LogLevel:
    setattr(Logger, _level.name, _level)
