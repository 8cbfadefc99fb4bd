"""mDNS end to end, inside a private network namespace made by the test (multicast never leaves it):
two daemons with distinct names are discovered, a model load changes "models", a same-name box becomes
"name (2)", a stopped box says goodbye and disappears, and the client pool drops it."""

from __future__ import annotations

import pytest

from appliance.mdns.announcer import catalog_digest, txt_record
from tests.appliance.mdns.netns import run_scenario

# The scenario starts real daemons in a private network namespace.
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def scenario():
    return run_scenario("tests.appliance.mdns.scenario", "mDNS tests", timeout=240)


def test_two_daemons_are_discovered(scenario):
    both = scenario["both"]
    assert set(both) == {"box-a", "box-b"}
    for name, box in both.items():
        assert box["port"] == scenario["ports"][name]
        assert box["grpc"] == scenario["grpc_ports"][name]  # the TXT record's grpc=<port>
        assert box["addresses"] == ["127.0.0.1"]
        assert box["models"] == 1 and box["hw"] == "cpu" and box["version"]
    assert both["box-a"]["id"] != both["box-b"]["id"]
    assert {b["name"] for b in scenario["cli"]} == {"box-a", "box-b"}
    assert all(b["url"].startswith("http://127.0.0.1:") for b in scenario["cli"])
    assert {b["grpc_url"] for b in scenario["cli"]} == {f"127.0.0.1:{p}" for p in scenario["grpc_ports"].values()}


def test_model_load_updates_the_record(scenario):
    assert scenario["after_load"]["box-a"]["models"] == 2
    assert scenario["after_load"]["box-b"]["models"] == 1


def test_same_name_is_resolved(scenario):
    assert set(scenario["conflict"]) == {"box-a", "box-b", "box-a (2)"}
    assert "box-a (2)" in scenario["conflict_log"][0]


def test_shutdown_says_goodbye(scenario):
    assert scenario["b_exit"] == 0 and scenario["b_log_goodbye"]
    assert set(scenario["after_stop"]) == {"box-a"}


def test_pool_spreads_requests_and_drops_a_silent_box(scenario):
    assert scenario["pool_before"] == [10, 10, 10, 10]
    assert scenario["pool_after"] == [10, 10, 10, 10]
    assert scenario["pool_healthy"] == ["box-a"]


def test_pool_over_grpc(scenario):
    assert scenario["grpc_pool_before"] == [10, 10, 10, 10]
    assert scenario["grpc_pool_after"] == [10, 10, 10, 10]  # the stopped box is dropped
    assert scenario["grpc_pool_healthy"] == ["box-a"]


def test_txt_record_is_short():
    record = txt_record("0f6c2f7e-8d39-4a4e-9d8e-0f2e5e0b6a11", ["cpu", "nvidia"], 12)
    assert all(len(key) <= 9 for key in record)
    assert sum(len(k) + len(v) + 2 for k, v in record.items()) < 400
    assert record["api"] == "v2" and record["path"] == "/v2" and record["hw"] == "cpu,nvidia"
    assert "grpc" not in record
    assert txt_record("id", ["cpu"], 1, grpc_port=8001)["grpc"] == "8001"


def test_the_record_says_which_ports_speak_tls():
    assert "tls" not in txt_record("id", ["cpu"], 1, grpc_port=8001)
    assert txt_record("id", ["cpu"], 1, grpc_port=8001, tls=["http", "grpc"])["tls"] == "http,grpc"
    assert txt_record("id", ["cpu"], 1, tls=["grpc"])["tls"] == "grpc"


def test_the_record_says_when_the_ready_models_change():
    record = txt_record("id", ["cpu"], 2, catalog=catalog_digest(["mlp", "resnet"]))
    assert len(record["mset"]) == 8 and "mset" not in txt_record("id", ["cpu"], 2)
    assert catalog_digest(["resnet", "mlp"]) == record["mset"]  # the order does not matter
    assert catalog_digest(["mlp", "yolo"]) != record["mset"]  # a swap with the same count does
