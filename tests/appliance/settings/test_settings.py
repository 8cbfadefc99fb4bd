from __future__ import annotations

import re
from pathlib import Path

import pytest

from appliance.core.errors import ConfigError
from appliance.settings import Settings, load_settings


def test_defaults():
    settings = load_settings({}, {"HOME": "/home/u"})
    assert settings.server.host == "0.0.0.0" and settings.http.port == 8000 and settings.fleet.mdns
    assert settings.server.model_repository is None


def test_precedence_file_then_environment_then_flags(tmp_path):
    file = tmp_path / "appliance.toml"
    file.write_text('http_port = 9000\nhost = "127.0.0.1"\nlog_level = "DEBUG"\nonnx_providers = ["A", "B"]\n')
    env = {"APPLIANCE_HTTP_PORT": "9100", "APPLIANCE_MDNS": "off", "APPLIANCE_CONFIG": str(file)}
    settings = load_settings({"http_port": 9200, "host": None}, env)
    assert settings.http.port == 9200  # flag beats environment beats file
    assert settings.server.host == "127.0.0.1"
    assert settings.fleet.mdns is False
    assert settings.server.log_level == "DEBUG"
    assert settings.models.onnx_providers == ("A", "B")


def test_systemd_state_directory():
    assert load_settings({}, {"STATE_DIRECTORY": "/var/lib/appliance"}).server.state_dir == Path("/var/lib/appliance")


@pytest.mark.parametrize("flags,env,message", [
    ({"http_port": 70000}, {}, "http_port must be"),
    ({}, {"APPLIANCE_HTTP_PORT": "eighty"}, "setting 'http_port'"),
    ({}, {"APPLIANCE_MDNS": "maybe"}, "expected true/false"),
    ({"request_deadline": -1.0}, {}, "request_deadline must be >= 0"),
])
def test_bad_values_say_which_setting(flags, env, message):
    with pytest.raises(ConfigError, match=message):
        load_settings(flags, env)


def test_unknown_key_in_file(tmp_path):
    file = tmp_path / "bad.toml"
    file.write_text("http_prot = 1\n")
    with pytest.raises(ConfigError, match="unknown setting"):
        load_settings({}, {}, file)


def test_transport_limit_defaults():
    settings = load_settings({}, {"HOME": "/home/u"})
    assert settings.limits.max_request_memory_bytes == 1024**3 >= settings.limits.max_request_bytes
    assert settings.http.max_connections == 4096
    assert settings.http.header_timeout == settings.http.body_timeout == 60.0
    assert settings.limits.stream_buffer_bytes == 64 * 1024**2 and settings.limits.stream_stall_timeout == 60.0
    tuned = load_settings({}, {"APPLIANCE_STREAM_BUFFER_BYTES": "1048576", "APPLIANCE_STREAM_STALL_TIMEOUT": "5"})
    assert (tuned.limits.stream_buffer_bytes, tuned.limits.stream_stall_timeout) == (1 << 20, 5.0)


@pytest.mark.parametrize("env,message", [
    ({"APPLIANCE_MAX_REQUEST_BYTES": "2048", "APPLIANCE_MAX_REQUEST_MEMORY_BYTES": "1024"},
     "max_request_memory_bytes .* must be at least max_request_bytes"),
    ({"APPLIANCE_MAX_CONNECTIONS": "0"}, "max_connections must be at least 1"),
    ({"APPLIANCE_HEADER_TIMEOUT": "0"}, "header_timeout must be > 0"),
    ({"APPLIANCE_BODY_TIMEOUT": "-1"}, "body_timeout must be > 0"),
    ({"APPLIANCE_STREAM_BUFFER_BYTES": "0"}, "stream_buffer_bytes must be at least 1"),
    ({"APPLIANCE_STREAM_STALL_TIMEOUT": "0"}, "stream_stall_timeout must be > 0"),
])
def test_transport_limits_are_validated(env, message):
    with pytest.raises(ConfigError, match=message):
        load_settings({}, env)


def test_grpc_settings():
    settings = load_settings({}, {"HOME": "/home/u"})
    assert settings.grpc.enabled and settings.grpc.port == 8001
    assert load_settings({"grpc_port": 0, "grpc": False}, {}).grpc.enabled is False
    assert load_settings({}, {"APPLIANCE_GRPC_PORT": "9001"}).grpc.port == 9001
    with pytest.raises(ConfigError, match="grpc_port must be 0..65535"):
        load_settings({"grpc_port": -1}, {})
    with pytest.raises(ConfigError, match="give gRPC its own port"):
        load_settings({"grpc_port": 8000}, {})
    assert load_settings({"grpc_port": 8000, "grpc": False}, {}).grpc.enabled is False  # off: no clash


def test_grpc_flags():
    from appliance.cli import _parser

    args = _parser().parse_args(["serve", "--grpc-port", "0", "--no-grpc"])
    assert args.grpc_port == 0 and args.grpc is False
    assert _parser().parse_args(["serve"]).grpc is None  # not given: the settings decide


def test_shared_memory_defaults_admit_this_host_only():
    settings = load_settings({}, {"HOME": "/home/u"})
    assert settings.shm.client_shm == "local" and settings.shm.local_networks == ("127.0.0.0/8", "::1/128")
    assert settings.shm.max_regions == 64 and settings.shm.max_bytes == 2 * 1024**3
    narrowed = load_settings({"client_shm": "any"}, {"APPLIANCE_SHM_LOCAL_NETWORKS": ""})
    assert narrowed.shm.client_shm == "any" and narrowed.shm.local_networks == ()


@pytest.mark.parametrize("env,message", [
    ({"APPLIANCE_CLIENT_SHM": "lan"}, "client_shm must be off, local or any"),
    ({"APPLIANCE_SHM_LOCAL_NETWORKS": "localhost"}, "shm_local_networks: 'localhost' is not a network"),
    ({"APPLIANCE_SHM_MAX_REGIONS": "0"}, "shm_max_regions must be at least 1"),
    ({"APPLIANCE_SHM_MAX_BYTES": "-5"}, "shm_max_bytes must be at least 1"),
])
def test_shared_memory_settings_are_validated(env, message):
    with pytest.raises(ConfigError, match=message):
        load_settings({}, env)


def test_sections_as_toml_tables_beside_the_flat_keys(tmp_path):
    file = tmp_path / "appliance.toml"
    file.write_text('max_connections = 100\n[http]\nport = 9000\n[grpc]\nmax_streams = 7\n[limits]\nmax_inputs = 9\n')
    settings = load_settings({}, {}, file)
    assert (settings.http.port, settings.http.max_connections) == (9000, 100)
    assert settings.grpc.max_streams == 7 and settings.limits.max_inputs == 9
    file.write_text("[http]\nhttp_port = 9000\n")  # a table takes the section's own names
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) \['http_port'\] in the \[http\] table"):
        load_settings({}, {}, file)


def test_each_section_checks_itself_and_names_the_setting():
    from appliance.settings.sections import GrpcSection, LimitsSection, TraceSection

    with pytest.raises(ConfigError, match="grpc_max_streams must be at least 1"):
        GrpcSection(max_streams=0)
    with pytest.raises(ConfigError, match="max_request_memory_bytes .* must be at least max_request_bytes"):
        LimitsSection(max_request_bytes=2048, max_request_memory_bytes=1024)
    with pytest.raises(ConfigError, match="trace_max_files must be at least 1"):
        TraceSection(max_files=0)
    with pytest.raises(ConfigError, match="grpc_max_connections .* must be below max_connections"):
        load_settings({}, {"APPLIANCE_MAX_CONNECTIONS": "64", "APPLIANCE_GRPC_MAX_CONNECTIONS": "64"})


def test_build_takes_flat_keys():
    settings = Settings.build(state_dir=Path("/tmp/x"), metrics=False, grpc_max_streams=3, trace_max_files=5)
    assert not settings.metrics.enabled and settings.grpc.max_streams == 3 and settings.trace.max_files == 5
    with pytest.raises(ConfigError, match="unknown setting"):
        Settings.build(state_dir=Path("/tmp/x"), metric=False)


def test_every_environment_variable_and_flag_of_before_still_works():
    """The flat names of round 2 (APPLIANCE_<NAME>, TOML keys, flags) all reach their sections."""
    from appliance.commands.serve import serve_flags
    from appliance.settings.loading import flat_fields

    keys = set(flat_fields())
    assert {"http_port", "grpc_port", "grpc", "max_request_bytes", "max_request_memory_bytes", "max_connections",
            "header_timeout", "body_timeout", "onnx_providers", "intra_op_threads", "event_loop", "model_control_mode",
            "load_models", "repository_poll_secs", "selection", "retune", "tune_budget", "retune_on_traffic",
            "retune_interval", "retune_min_requests", "cache_max_bytes", "metrics", "metrics_port", "metrics_interval",
            "history_raw_hours", "history_minute_days", "history_hour_days", "history_max_bytes", "strict_readiness",
            "shutdown_timeout", "exit_timeout", "auth_token", "auth_exempt_networks", "trusted_proxies",
            "allowed_hosts", "protect_inference", "client_shm", "shm_local_networks", "shm_max_regions",
            "shm_max_bytes", "push_max_file_bytes", "push_max_total_bytes", "max_concurrent_requests",
            "stream_buffer_bytes", "stream_stall_timeout", "max_tensor_elements", "max_inputs", "trace_file",
            "trace_max_bytes", "notify_socket", "watchdog_usec", "state_dir", "model_repository", "host", "mdns",
            "name", "mdns_interfaces", "log_level"} <= keys
    assert set(serve_flags()) <= keys  # every flag sets a setting of that name


def test_the_settings_reference_in_the_docs_is_the_code_s():
    """docs/settings.md holds python -m appliance.commands.settings_reference's output between its markers."""
    from appliance.commands.settings_reference import BEGIN, END, markdown

    document = (Path(__file__).resolve().parents[3] / "docs" / "settings.md").read_text()
    start, end = document.find(BEGIN), document.find(END)
    assert start != -1 and end != -1, "docs/settings.md has no generated reference: run python -m " \
                                      "appliance.commands.settings_reference --write docs/settings.md"
    assert document[start:end + len(END) + 1] == markdown(), (
        "docs/settings.md is stale: run python -m appliance.commands.settings_reference --write docs/settings.md")


def test_response_cache_and_rate_limiter_are_off_by_default():
    settings = load_settings({}, {"HOME": "/home/u"})
    assert settings.response_cache.parsed is None
    assert settings.rate_limiter.mode == "off" and not settings.rate_limiter.enabled
    assert settings.rate_limiter.limits == ()


def test_tritons_cache_and_rate_limit_flags():
    from appliance.cli import _parser
    from appliance.engine.shared_config import CacheConfig, ResourceLimit

    args = _parser().parse_args(["serve", "--cache-config", "local,size=1048576", "--rate-limit", "EXECUTION_COUNT",
                                 "--rate-limit-resource", "R1:4", "--rate-limit-resource", "R2:2:1"])
    settings = load_settings(vars(args), {})
    assert settings.response_cache.parsed == CacheConfig(1048576)
    assert settings.rate_limiter.enabled
    assert settings.rate_limiter.limits == (ResourceLimit("r1", 4), ResourceLimit("r2", 2, 1))
    from_env = load_settings({}, {"APPLIANCE_CACHE_CONFIG": "local,size=4096", "APPLIANCE_RATE_LIMIT": "off",
                                  "APPLIANCE_RATE_LIMIT_RESOURCES": "R1:4,R2:2:1"})
    assert from_env.response_cache.parsed == CacheConfig(4096) and len(from_env.rate_limiter.limits) == 2


def test_cache_and_rate_limit_tables_in_the_settings_file(tmp_path):
    file = tmp_path / "appliance.toml"
    file.write_text('[response_cache]\nconfig = ["local,size=8192"]\n[rate_limiter]\nmode = "execution_count"\n'
                    'resources = ["npu:1"]\n')
    settings = load_settings({}, {}, file)
    assert settings.response_cache.parsed is not None and settings.response_cache.parsed.size == 8192
    assert settings.rate_limiter.enabled and settings.rate_limiter.limits[0].name == "npu"


@pytest.mark.parametrize("env, message", [
    ({"APPLIANCE_CACHE_CONFIG": "redis,size=4096"}, "the redis cache has no setting size"),
    ({"APPLIANCE_CACHE_CONFIG": "memcached,size=4096"}, "unknown cache 'memcached'"),
    ({"APPLIANCE_CACHE_CONFIG": "local,size=12"}, "too small"),
    ({"APPLIANCE_RATE_LIMIT": "sometimes"}, "rate_limit must be execution_count or off"),
    ({"APPLIANCE_RATE_LIMIT_RESOURCES": "R1"}, "<resource_name>:<count>"),
])
def test_cache_and_rate_limit_settings_are_validated(env, message):
    with pytest.raises(ConfigError, match=message):
        load_settings({}, env)



REMOVED = [  # (environment variable, the file's line, its table and line there, what the error says)
    ("APPLIANCE_WORKERS", "workers = 2", "[http]\nworkers = 2", "front-end workers were removed.*remove workers"),
    ("APPLIANCE_GRPC_TRANSPORT", 'grpc_transport = "grpcio"', '[grpc]\ntransport = "appliance"',
     "the grpcio gRPC server was removed.*own HTTP/2 transport serves gRPC: remove grpc_transport"),
]


@pytest.mark.parametrize("variable, line, table, words", REMOVED, ids=[r[0] for r in REMOVED])
def test_a_removed_setting_given_anywhere_is_refused_with_what_changed(tmp_path, variable, line, table, words):
    with pytest.raises(ConfigError, match=f"{variable}.*{words}"):
        load_settings({}, {"HOME": "/home/u", variable: "0"})
    for text in (line, table):
        file = tmp_path / "appliance.toml"
        file.write_text(text + "\n")
        with pytest.raises(ConfigError, match=f"{re.escape(str(file))}.*{words}"):
            load_settings({}, {"HOME": "/home/u"}, file)
