"""The CLI subcommands as users run them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.builders import cnn_model, save


def _appliance(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    environment = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "appliance", *args], capture_output=True, text=True,
                          timeout=300, env=environment)


@pytest.mark.slow  # the hardware probe imports every runtime in a child process
def test_probe_json_reports_this_box():
    result = _appliance("probe", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    cpu = report["sections"]["cpu"]
    assert cpu["status"] == "present" and cpu["logical_threads"] >= 1 and cpu["model"]
    assert report["sections"]["memory"]["total_bytes"] > 0
    runtimes = report["sections"]["runtimes"]
    assert "CPUExecutionProvider" in runtimes["onnxruntime"]["loadable_providers"]
    assert "CPU" in runtimes["openvino"]["devices"]
    assert len(report["fingerprint"]) >= 16 and "cpu" in report["accelerators"]


@pytest.mark.slow  # the hardware probe imports every runtime in a child process
def test_probe_table():
    result = _appliance("probe")
    assert result.returncode == 0 and "fingerprint" in result.stdout and "onnxruntime" in result.stdout
    assert "probing CPU, memory" in result.stderr and "probed runtimes (" in result.stderr  # never silent


@pytest.mark.slow  # tuning measures plans
def test_tune_then_cache_ls_and_clear(tmp_path):
    repo = tmp_path / "repo"
    save(cnn_model(), repo / "cnn" / "1" / "model.onnx")
    state = tmp_path / "state"
    env = {"APPLIANCE_TUNE_BUDGET": "0.05"}
    tuned = _appliance("tune", "cnn", "--model-repository", str(repo), "--state-dir", str(state), env=env)
    assert tuned.returncode == 0, tuned.stderr
    assert "chosen" in tuned.stdout and "onnxruntime:CPU" in tuned.stdout and "openvino:CPU" in tuned.stdout
    assert "2/" in tuned.stderr  # the progress bar went through the candidates
    listed = _appliance("cache", "ls", "--state-dir", str(state))
    assert "1 entries" in listed.stdout and "cnn:1" in listed.stdout
    cleared = _appliance("cache", "clear", "--state-dir", str(state))
    assert "removed 1 entries" in cleared.stdout


@pytest.mark.slow  # tuning measures plans
def test_tune_unknown_model_is_a_clear_error(tmp_path):
    result = _appliance("tune", "nope", "--model-repository", str(tmp_path), "--state-dir", str(tmp_path / "s"))
    assert result.returncode == 2 and "no model 'nope'" in result.stderr


def test_cache_ls_lists_corrupt_entries_and_clear_removes_them(tmp_path):
    from model_cache import ModelCache

    state = tmp_path / "state"
    cache = ModelCache(state / "cache")
    cache.store("good", {"model": "cnn", "version": 1, "chosen": "onnxruntime:CPU"})
    wrong = cache.store("wrong-shape", {"model": "cnn", "version": 2, "chosen": "openvino:CPU"})
    (wrong.path / "manifest.json").write_text("[]")  # valid JSON, wrong shape
    (cache.root / "not-json").mkdir()
    (cache.root / "not-json" / "manifest.json").write_text("{")
    listed = _appliance("cache", "ls", "--state-dir", str(state))
    assert listed.returncode == 0, listed.stderr
    assert "1 entries" in listed.stdout and "2 corrupt" in listed.stdout
    assert "cnn:1" in listed.stdout
    assert "wrong-shape  corrupt: manifest.json holds a JSON list, not an object" in listed.stdout
    assert "not-json  corrupt: manifest.json is not valid JSON" in listed.stdout
    assert "appliance cache clear" in listed.stdout  # says how to get rid of them
    cleared = _appliance("cache", "clear", "--state-dir", str(state))
    assert cleared.returncode == 0, cleared.stderr
    assert "removed 3 entries" in cleared.stdout
    assert sorted(p.name for p in cache.root.iterdir() if not p.name.startswith(".")) == []


def test_cache_ls_of_a_state_dir_without_a_cache_creates_nothing(tmp_path):
    listed = _appliance("cache", "ls", "--state-dir", str(tmp_path / "state"))
    assert listed.returncode == 0, listed.stderr
    assert "0 entries" in listed.stdout
    assert not (tmp_path / "state" / "cache").exists()
    cleared = _appliance("cache", "clear", "--state-dir", str(tmp_path / "state"))
    assert cleared.returncode == 0 and "removed 0 entries" in cleared.stdout


def test_the_documented_command_line_block_is_the_parsers_own():
    from pathlib import Path

    from appliance.cli import usage_summary

    page = (Path(__file__).parents[3] / "docs" / "getting-started.md").read_text()
    block = page.split("## Command line\n\n```\n", 1)[1].split("```", 1)[0]
    assert block == usage_summary(), (
        "docs/getting-started.md's command-line block drifted: paste the output of `python -m appliance.cli`")


def test_a_reader_that_goes_away_ends_a_command_quietly(tmp_path):
    """`appliance stats --json | head`: a closed pipe is the reader's choice, not an error to print."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "-m", "appliance", "cache", "ls", "--state-dir", str(tmp_path)],
                                stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (141, "")


@pytest.mark.parametrize(("given", "error"), [("verbose", None), ("Warning", None),
                                              ("loud", "log_level must be DEBUG, INFO, WARNING or ERROR")])
def test_log_levels_are_read_in_any_case_or_refused_in_one_line(tmp_path, given, error):
    result = _appliance("cache", "ls", "--state-dir", str(tmp_path), env={"APPLIANCE_LOG_LEVEL": given})
    if error is None:
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    else:
        assert result.returncode == 2 and result.stderr.strip() == f"appliance: {error}, got {given.upper()!r}"


@pytest.mark.e2e  # starts the daemon, which stops at the bind
@pytest.mark.parametrize("flag", ["--http-port", "--metrics-port"])
def test_a_port_in_use_is_one_line_naming_the_flag(tmp_path, flag):
    """The gRPC port said so in one line; the HTTP ports printed a 25-line traceback."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        ports = {"--http-port": "0", "--metrics-port": "0", flag: port}
        result = _appliance("serve", "--host", "127.0.0.1", "--grpc-port", "0", "--no-mdns", "--no-selection",
                            "--state-dir", str(tmp_path / "state"), *(x for item in ports.items() for x in item))
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"appliance: cannot bind HTTP to 127.0.0.1:{port}" in result.stderr and flag in result.stderr
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
