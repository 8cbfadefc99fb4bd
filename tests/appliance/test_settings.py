from __future__ import annotations

from pathlib import Path

import pytest

from appliance.errors import ConfigError
from appliance.settings import load_settings


def test_defaults():
    settings = load_settings({}, {"HOME": "/home/u"})
    assert settings.host == "0.0.0.0" and settings.http_port == 8000 and settings.mdns
    assert settings.model_repository is None


def test_precedence_file_then_environment_then_flags(tmp_path):
    file = tmp_path / "appliance.toml"
    file.write_text('http_port = 9000\nhost = "127.0.0.1"\nlog_level = "DEBUG"\nonnx_providers = ["A", "B"]\n')
    env = {"APPLIANCE_HTTP_PORT": "9100", "APPLIANCE_MDNS": "off", "APPLIANCE_CONFIG": str(file)}
    settings = load_settings({"http_port": 9200, "host": None}, env)
    assert settings.http_port == 9200  # flag beats environment beats file
    assert settings.host == "127.0.0.1"
    assert settings.mdns is False
    assert settings.log_level == "DEBUG"
    assert settings.onnx_providers == ("A", "B")


def test_systemd_state_directory():
    assert load_settings({}, {"STATE_DIRECTORY": "/var/lib/appliance"}).state_dir == Path("/var/lib/appliance")


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
    assert settings.max_request_memory_bytes == 1024**3 >= settings.max_request_bytes
    assert settings.max_connections == 4096
    assert settings.header_timeout == settings.body_timeout == 60.0
    assert settings.stream_buffer_bytes == 64 * 1024**2 and settings.stream_stall_timeout == 60.0
    tuned = load_settings({}, {"APPLIANCE_STREAM_BUFFER_BYTES": "1048576", "APPLIANCE_STREAM_STALL_TIMEOUT": "5"})
    assert (tuned.stream_buffer_bytes, tuned.stream_stall_timeout) == (1 << 20, 5.0)


@pytest.mark.parametrize("env,message", [
    ({"APPLIANCE_MAX_REQUEST_BYTES": "2048", "APPLIANCE_MAX_REQUEST_MEMORY_BYTES": "1024"},
     "max_request_memory_bytes .* must be at least max_request_bytes"),
    ({"APPLIANCE_MAX_CONNECTIONS": "0"}, "max_connections must be at least 1"),
    ({"APPLIANCE_HEADER_TIMEOUT": "0"}, "header_timeout must be > 0"),
    ({"APPLIANCE_BODY_TIMEOUT": "-1"}, "body_timeout must be > 0"),
    ({"APPLIANCE_STREAM_BUFFER_BYTES": "0"}, "stream_buffer_bytes must be at least 1"),
    ({"APPLIANCE_STREAM_STALL_TIMEOUT": "0"}, "stream_stall_timeout > 0"),
])
def test_transport_limits_are_validated(env, message):
    with pytest.raises(ConfigError, match=message):
        load_settings({}, env)


def test_grpc_settings():
    settings = load_settings({}, {"HOME": "/home/u"})
    assert settings.grpc and settings.grpc_port == 8001
    assert load_settings({"grpc_port": 0, "grpc": False}, {}).grpc is False
    assert load_settings({}, {"APPLIANCE_GRPC_PORT": "9001"}).grpc_port == 9001
    with pytest.raises(ConfigError, match="grpc_port must be 0..65535"):
        load_settings({"grpc_port": -1}, {})
    with pytest.raises(ConfigError, match="give gRPC its own port"):
        load_settings({"grpc_port": 8000}, {})
    assert load_settings({"grpc_port": 8000, "grpc": False}, {}).grpc is False  # off: no clash


def test_grpc_flags():
    from appliance.cli import _parser

    args = _parser().parse_args(["serve", "--grpc-port", "0", "--no-grpc"])
    assert args.grpc_port == 0 and args.grpc is False
    assert _parser().parse_args(["serve"]).grpc is None  # not given: the settings decide


def test_shared_memory_defaults_admit_this_host_only():
    settings = load_settings({}, {"HOME": "/home/u"})
    assert settings.client_shm == "local" and settings.shm_local_networks == ("127.0.0.0/8", "::1/128")
    assert settings.shm_max_regions == 64 and settings.shm_max_bytes == 2 * 1024**3
    narrowed = load_settings({"client_shm": "any"}, {"APPLIANCE_SHM_LOCAL_NETWORKS": ""})
    assert narrowed.client_shm == "any" and narrowed.shm_local_networks == ()


@pytest.mark.parametrize("env,message", [
    ({"APPLIANCE_CLIENT_SHM": "lan"}, "client_shm must be off, local or any"),
    ({"APPLIANCE_SHM_LOCAL_NETWORKS": "localhost"}, "shm_local_networks: 'localhost' is not a network"),
    ({"APPLIANCE_SHM_MAX_REGIONS": "0"}, "shm_max_regions must be at least 1"),
    ({"APPLIANCE_SHM_MAX_BYTES": "-5"}, "shm_max_bytes must be at least 1"),
])
def test_shared_memory_settings_are_validated(env, message):
    with pytest.raises(ConfigError, match=message):
        load_settings({}, env)
