"""Triton's command line on ``appliance serve``: every flag parses with Triton's syntax, means what the table
says (a setting, a log line, or a refusal naming why), and the docs' table is the code's."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.cli import _parser, main
from appliance.commands import serve
from appliance.commands.triton_flags import BEGIN, END, FLAGS, Fate, boolean, markdown, read
from appliance.core.errors import ConfigError
from appliance.settings import Settings, load_settings

DOCS = Path(__file__).resolve().parents[3] / "docs" / "differences-from-triton.md"

# A value each flag takes (the refused ones: a value they refuse); by the flag's type otherwise.
_SAMPLES = {
    "--model-control-mode": "explicit", "--rate-limit": "off", "--log-format": "ISO8601", "--load-model": "m",
    "--cache-config": "local,size=4096", "--rate-limit-resource": "R1:2", "--trace-config": "rate=10",
    "--trace-level": "TIMESTAMPS", "--http-restricted-api": "inference:k=v",
    "--grpc-restricted-protocol": "inference:k=v",
    "--cuda-memory-pool-byte-size": "0:0", "--model-repository": "/srv/models", "--model-store": "/srv/models",
    "--backend-config": "python,shm-default-byte-size=1048576", "--metrics-config": "summary_latencies=true",
    "--response-cache-byte-size": "1048576",
}


def _sample(row) -> list[str]:
    if row.kind is None:
        return [row.flag]
    if row.flag in _SAMPLES:
        return [f"{row.flag}={_SAMPLES[row.flag]}"]
    value = {boolean: "true", int: "1", float: "2"}.get(row.kind, "x")
    return [f"{row.flag}={value}"]


def _read(*argv: str, tmp_path: Path | None = None) -> tuple[Settings, tuple[str, ...]]:
    """What ``appliance serve <argv>`` would run with, and the lines it would log about Triton's flags."""
    args = _parser(["serve"]).parse_args(["serve", *argv])
    flags = {k: v for k, v in vars(args).items() if k not in ("command", "config")}
    flags.update(serve.trace_settings(flags))
    reading = read(flags)
    flags.update(reading.settings)
    return load_settings(flags, {"HOME": str(tmp_path or "/tmp")}), reading.notices


@pytest.mark.parametrize("row", [row for row in FLAGS if row.flag != "--help"], ids=lambda row: row.flag)
def test_every_tritonserver_flag_is_recognised_and_does_what_its_row_says(row, tmp_path):
    argv = _sample(row)
    if row.fate is Fate.REFUSED and row.kind is boolean:
        argv = [f"{row.flag}={'false' if row.flag == '--allow-http' else 'true'}"]
    if row.fate is Fate.REFUSED:
        with pytest.raises(ConfigError, match=f"^{row.flag}: "):
            _read(*argv, tmp_path=tmp_path)
        return
    settings, notices = _read(*argv, tmp_path=tmp_path)
    if row.fate is Fate.IGNORED:
        assert [n for n in notices if n.startswith(f"{row.flag} is accepted, but ")], notices
    else:
        assert not [n for n in notices if n.startswith(f"{row.flag} is accepted")], notices


def test_a_qa_command_line_maps_onto_settings_and_says_what_it_ignores(tmp_path):
    # qa/L0_metrics/test.sh's SERVER_ARGS (peer access test), as Triton's qa writes it.
    settings, notices = _read(f"--model-repository={tmp_path}", "--model-control-mode=explicit", "--log-verbose=1",
                              "--pinned-memory-pool-byte-size=0", "--enable-peer-access=FALSE",
                              "--cuda-memory-pool-byte-size", "0:0", "--log-verbose=1")
    assert settings.server.model_repository == tmp_path and settings.models.control_mode == "explicit"
    assert settings.server.log_level == "DEBUG"
    assert [n.split(" ")[0] for n in notices] == ["--enable-peer-access", "--pinned-memory-pool-byte-size",
                                                   "--cuda-memory-pool-byte-size"]


def test_tritons_defaults_and_the_flags_that_change_them():
    settings, notices = _read()
    assert (settings.http.port, settings.grpc.port, settings.metrics.port) == (8000, 8001, 8002)
    assert settings.metrics.enabled and settings.server.server_id == "triton" and notices == ()
    assert (settings.http.address, settings.grpc.address, settings.metrics.address) == (None, None, None)
    settings, _ = _read("--id=edge-1", "--http-address=127.0.0.1", "--grpc-address", "10.0.0.2",
                        "--metrics-address=127.0.0.2", "--metrics-port=9102", "--metrics-interval-ms=500",
                        "--allow-grpc", "0", "--log-format=ISO8601", "--log-file=/tmp/triton.log")
    assert settings.server.server_id == "edge-1" and settings.server.log_format == "ISO8601"
    assert (settings.http.address, settings.grpc.address, settings.metrics.address) == (
        "127.0.0.1", "10.0.0.2", "127.0.0.2")
    assert settings.metrics.port == 9102 and settings.metrics.interval == 0.5 and not settings.grpc.enabled
    assert settings.server.log_file == "/tmp/triton.log"
    assert _read("--no-metrics-port")[0].metrics.port is None
    assert not _read("--allow-metrics=false")[0].metrics.enabled
    assert _read("--model-store=/srv/m")[0].server.model_repository == Path("/srv/m")
    assert not _read("--strict-readiness=false")[0].models.strict_readiness
    assert not _read("--no-strict-readiness")[0].models.strict_readiness  # the appliance's own flag stays


@pytest.mark.parametrize("argv, level, notice", [
    (["--log-verbose=0"], "INFO", None),
    (["--log-verbose", "2"], "DEBUG", None),
    (["--log-info=false"], "WARNING", None),
    (["--log-info=false", "--log-warning=0"], "ERROR", None),
    (["--log-info=false", "--log-warning=false", "--log-error=false"], "ERROR", "still logs errors"),
    (["--log-verbose=1", "--log-level=WARNING"], "WARNING", "--log-level is given too"),
])
def test_tritons_log_flags_set_the_least_severe_level_logged(argv, level, notice):
    settings, notices = _read(*argv)
    assert settings.server.log_level == level
    assert (notice is None and notices == ()) or (notice is not None and notice in " ".join(notices))


def test_restricted_apis_need_the_bearer_token_and_health_stays_open():
    settings, notices = _read("--grpc-restricted-protocol=inference:infer-key=infer-value")
    assert settings.auth.protect_inference and "Authorization: Bearer <token>" in notices[0]
    assert _read("--http-restricted-api=model-repository,shared-memory:admin-key=admin-value")[0].auth.protect_inference
    with pytest.raises(ConfigError, match="^--http-restricted-api: health stays open"):
        _read("--http-restricted-api=health,inference:k=v")
    with pytest.raises(ConfigError, match="unknown API"):
        _read("--http-restricted-api=infer:k=v")
    with pytest.raises(ConfigError, match="expected <apis>:<key>=<value>"):
        _read("--grpc-restricted-protocol=inference")


def test_refusals_name_the_flag_and_why():
    with pytest.raises(ConfigError, match="incompatible flags"):  # as Triton's qa/L0_response_cache expects
        _read("--response-cache-byte-size=12345", "--cache-config=local,size=67890")
    assert _read("--response-cache-byte-size=12345")[0].response_cache.config == ("local,size=12345",)
    assert _read("--exit-on-error=false")[1] == ()  # the appliance's behaviour: nothing to say
    assert "does not stop the daemon" in _read("--exit-on-error=true")[1][0]
    assert _read("--model-load-retry-count=0")[1] == ()
    with pytest.raises(ConfigError, match="log_format must be default or ISO8601"):
        _read("--log-format=json")


def test_two_repositories_are_refused_and_the_same_one_twice_is_fine(capsys):
    assert _read("--model-repository=/srv/a", "--model-store=/srv/a")[0].server.model_repository == Path("/srv/a")
    with pytest.raises(SystemExit):
        _read("--model-repository=/srv/a", "--model-repository=/srv/b")
    assert "serves one model repository" in capsys.readouterr().err


def test_a_refused_flag_stops_the_daemon_with_one_line(tmp_path, capsys):
    assert main(["serve", "--state-dir", str(tmp_path), "--no-mdns", "--allow-sagemaker=true"]) == 2
    err = capsys.readouterr().err
    assert err == "appliance: --allow-sagemaker: the appliance serves no SageMaker endpoint\n"


def test_booleans_take_tritons_spellings():
    assert [boolean(v) for v in ("true", "1", "TRUE", "on")] == [True] * 4
    assert [boolean(v) for v in ("false", "0", "FALSE", "off")] == [False] * 4
    with pytest.raises(SystemExit):
        _read("--allow-grpc=maybe")


def test_the_settings_reference_names_tritons_flags():
    flags = serve.serve_flags()
    assert flags["server_id"] == ("--id",) and flags["http_address"] == ("--http-address",)
    assert flags["metrics_port"] == ("--metrics-port", "--no-metrics-port")
    assert flags["model_repository"] == ("--model-repository", "--model-store")


def test_the_flag_table_in_the_docs_is_the_codes():
    document = DOCS.read_text()
    start, end = document.find(BEGIN), document.find(END)
    assert start != -1 and end != -1, "docs/differences-from-triton.md has no flag table"
    assert document[start:end + len(END) + 1] == markdown(), (
        "the flag table is stale: run python -m appliance.commands.triton_flags --write "
        "docs/differences-from-triton.md")
