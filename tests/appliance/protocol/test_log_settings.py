"""Triton's log settings change this process's logging: levels one by one, verbosity, time stamp format;
restore puts logging back."""

from __future__ import annotations

import io
import logging
import re

import pytest

from appliance.core.errors import InvalidInput, NotSupported
from appliance.protocol.log_settings import LogSettings, LogValues


@pytest.fixture
def logger():
    logger = logging.getLogger("test-log-settings")
    logger.propagate = False
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.stream = stream
    yield logger
    logger.removeHandler(handler)


def _emit(logger) -> str:
    logger.stream.truncate(0)
    logger.stream.seek(0)
    for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR):
        logger.log(level, "line")
    return logger.stream.getvalue()


def test_initial_values_follow_the_log_level_setting():
    assert LogValues.from_level("INFO") == LogValues()
    assert LogValues.from_level("debug").log_verbose_level == 1
    assert LogValues.from_level("ERROR") == LogValues(log_info=False, log_warning=False)
    with pytest.raises(InvalidInput):
        LogValues.from_level("LOUD")


def test_levels_switch_one_by_one_and_restore(logger):
    settings = LogSettings(logger, LogValues())
    assert _emit(logger).split() == ["INFO", "line", "WARNING", "line", "ERROR", "line"]
    answered = settings.update({"log_warning": False, "log_verbose_level": 2})
    assert answered["log_warning"] is False and answered["log_verbose_level"] == 2 and answered["log_file"] == ""
    assert _emit(logger).split() == ["DEBUG", "line", "INFO", "line", "ERROR", "line"]
    settings.update({"log_verbose_level": 0, "log_info": False, "log_error": False})
    assert _emit(logger) == ""
    settings.restore()
    assert _emit(logger).split() == ["INFO", "line", "WARNING", "line", "ERROR", "line"]


def test_format(logger):
    settings = LogSettings(logger, LogValues())
    settings.update({"log_format": "ISO8601"})
    logger.stream.truncate(0)
    logger.info("stamped")
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO test-log-settings: stamped", logger.stream.getvalue())
    settings.update({"log_format": "default"})
    logger.stream.seek(0)
    logger.stream.truncate(0)
    logger.info("plain")
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO", logger.stream.getvalue())


@pytest.mark.parametrize("changes,error,message", [
    ({"log_info": 1}, InvalidInput, "expect boolean for 'log_info'"),
    ({"log_verbose_level": True}, InvalidInput, "expect unsigned integer"),
    ({"log_verbose_level": -1}, InvalidInput, "expect unsigned integer"),
    ({"log_format": "json"}, InvalidInput, "invalid argument for log_format, got: json"),
    ({"log_file": "/tmp/x"}, NotSupported, "can not be updated through network protocol"),
    ({"log_colour": True}, InvalidInput, "unknown log setting 'log_colour'"),
])
def test_bad_changes_are_refused_whole(logger, changes, error, message):
    settings = LogSettings(logger, LogValues())
    with pytest.raises(error, match=message):
        settings.update({"log_info": False, **changes})
    assert settings.get()["log_info"] is True
    assert "INFO" in _emit(logger)
