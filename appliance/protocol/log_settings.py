"""Triton's log settings (the logging extension), applied to this process's logging at run time.

One object per daemon, free of any transport: gRPC's ``LogSettings`` RPC uses it today and a REST
``/v2/logging`` can share it. It works on the handlers of the root logger (where the CLI sends every
record): ``log_info``, ``log_warning`` and ``log_error`` switch those levels on and off one by one,
``log_verbose_level`` > 0 lets DEBUG records through, and ``log_format`` picks the time stamp format.
``restore`` puts logging back as it found it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Mapping

from appliance.core.errors import InvalidInput, NotSupported

__all__ = ["FORMATS", "LogSettings", "LogValues", "formatter"]

log = logging.getLogger(__name__)

_LINE = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _UtcFormatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging's name
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


def formatter(name: str) -> logging.Formatter:
    """The log line in Triton's format ``name`` (one of FORMATS; the CLI starts logging with it)."""
    return _UtcFormatter(_LINE) if name == "ISO8601" else logging.Formatter(_LINE)


# Triton's two formats: "default" (this daemon's usual local time stamp) and "ISO8601" (UTC).
FORMATS = ("default", "ISO8601")


@dataclasses.dataclass(frozen=True, slots=True)
class LogValues:
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    @classmethod
    def from_level(cls, level: str) -> LogValues:
        """What a ``log_level`` setting (DEBUG, INFO, WARNING, ERROR) means in Triton's terms."""
        number = logging.getLevelName(level.upper())
        if not isinstance(number, int):
            raise InvalidInput(f"log level {level!r} is not one of DEBUG, INFO, WARNING, ERROR")
        return cls(log_info=number <= logging.INFO, log_warning=number <= logging.WARNING,
                   log_error=number <= logging.ERROR, log_verbose_level=1 if number <= logging.DEBUG else 0)

    def passes(self, levelno: int) -> bool:
        if levelno >= logging.CRITICAL:
            return True  # never silenced: the daemon is about to stop
        if levelno >= logging.ERROR:
            return self.log_error
        if levelno >= logging.WARNING:
            return self.log_warning
        if levelno >= logging.INFO:
            return self.log_info
        return self.log_verbose_level > 0

    def lowest_level(self) -> int:
        for enabled, level in ((self.log_verbose_level > 0, logging.DEBUG), (self.log_info, logging.INFO),
                               (self.log_warning, logging.WARNING), (self.log_error, logging.ERROR)):
            if enabled:
                return level
        return logging.CRITICAL


class _LevelFilter(logging.Filter):
    def __init__(self, owner: LogSettings) -> None:
        super().__init__()
        self._owner = owner

    def filter(self, record: logging.LogRecord) -> bool:
        return self._owner.values.passes(record.levelno)


_BOOLS = ("log_info", "log_warning", "log_error")


class LogSettings:
    def __init__(self, logger: logging.Logger, initial: LogValues, log_file: str = "") -> None:
        """``initial`` describes how ``logger`` is set up now (nothing changes until ``update``)."""
        self._logger = logger
        self._log_file = log_file
        self.values = initial
        self._filter = _LevelFilter(self)
        self._lock = threading.Lock()
        self._saved: tuple[int, list[tuple[logging.Handler, logging.Formatter | None]]] | None = None

    def get(self) -> dict[str, bool | int | str]:
        return {"log_file": self._log_file, **dataclasses.asdict(self.values)}

    def update(self, changes: Mapping[str, object]) -> dict[str, bool | int | str]:
        """Check every change, then apply them all to logging at once; returns the settings now."""
        fields: dict[str, bool | int | str] = {}
        for key, value in changes.items():
            if key == "log_file":
                raise NotSupported("log file location can not be updated through network protocol; the daemon "
                                  "logs to its standard error (the journal under systemd)")
            if key in _BOOLS:
                if type(value) is not bool:
                    raise InvalidInput(f"expect boolean for '{key}'; got {value!r}"[:200])
            elif key == "log_verbose_level":
                if type(value) is not int or not 0 <= value < 2**32:
                    raise InvalidInput(f"expect unsigned integer for '{key}', got {value!r}"[:200])
            elif key == "log_format":
                if value not in FORMATS:
                    raise InvalidInput(f"invalid argument for log_format, got: {str(value)[:40]}; use one of "
                                       f"{', '.join(FORMATS)}")
            else:
                raise InvalidInput(f"unknown log setting {key[:80]!r}; the settings are log_file, "
                                   f"{', '.join(_BOOLS)}, log_verbose_level, log_format")
            fields[key] = value
        with self._lock:
            format_changed = "log_format" in fields and fields["log_format"] != self.values.log_format
            self.values = dataclasses.replace(self.values, **fields)  # type: ignore[arg-type]
            self._apply(format_changed)
        log.info("log settings changed: %s", ", ".join(f"{k}={v}" for k, v in sorted(fields.items())))
        return self.get()

    def _apply(self, format_changed: bool) -> None:
        if self._saved is None:  # first change: remember how logging was, to restore it
            self._saved = (self._logger.level, [(h, h.formatter) for h in self._logger.handlers])
            for handler in self._logger.handlers:
                handler.addFilter(self._filter)
        self._logger.setLevel(self.values.lowest_level())
        if format_changed:
            for handler in self._logger.handlers:
                handler.setFormatter(formatter(self.values.log_format))

    def restore(self) -> None:
        """Logging as it was before the first update."""
        with self._lock:
            if self._saved is None:
                return
            level, handlers = self._saved
            self._logger.setLevel(level)
            for handler, formatter in handlers:
                handler.removeFilter(self._filter)
                handler.setFormatter(formatter)
            self._saved = None
