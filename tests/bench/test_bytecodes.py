"""bench.bytecodes' own pieces: each function's counts go to its own file's layer (bench.layers' rules, files
named from their package as py-spy names them), per request, and the table sets the trees side by side."""

from __future__ import annotations

import pytest

from bench.bytecode_daemon import run_traced
from bench.bytecodes import Counted, by_layer, main, sequence_bodies, table, top_functions
from bench.layers import LAYERS

_COUNTED = [
    Counted("/srv/x/appliance/rest/lane_connection.py", 140, "LaneConnection.data_received", 600, 10),
    Counted("/srv/x/appliance/rest/codec.py", 651, "_binary_answer", 1_100, 10),
    Counted("/srv/x/appliance/rest/codec.py", 346, "_decode_request", 300, 10),
    Counted("/srv/x/appliance/engine/stats.py", 159, "ModelStats.record_batch", 900, 10),
    Counted("/usr/lib/python3.11/asyncio/events.py", 78, "Handle._run", 100, 20),
]


def test_each_function_goes_to_its_own_files_layer():
    assert [entry.layer for entry in _COUNTED] == ["HTTP framing", "encode", "decode", "statistics", "event loop"]


def test_the_layers_are_per_request_and_every_layer_is_listed():
    layers = by_layer(_COUNTED, 10)
    assert list(layers) == list(LAYERS)
    assert layers["encode"] == (110.0, 1.0) and layers["event loop"] == (10.0, 2.0) and layers["scheduling"] == (0, 0)
    assert sum(bytecodes for bytecodes, _ in layers.values()) == 300.0


def test_the_top_functions_are_the_busiest_named_from_their_package():
    assert top_functions(_COUNTED, 10, 2) == [("appliance/rest/codec.py:651 _binary_answer", 110.0, 1.0),
                                             ("appliance/engine/stats.py:159 ModelStats.record_batch", 90.0, 1.0)]


def test_the_table_sets_the_first_tree_against_the_others():
    lines = table({"appliance": by_layer(_COUNTED, 10), "baseline": by_layer(_COUNTED * 2, 10)}).splitlines()
    assert lines[0] == ("| layer | appliance: bytecodes (calls) | baseline: bytecodes (calls) | appliance × baseline |")
    assert "| encode | 110 (1.0) | 220 (2.0) | 0.500 |" in lines
    assert "| scheduling | 0 (0.0) | 0 (0.0) | - |" in lines
    assert lines[-1] == "| total | 300 (6.0) | 600 (12.0) | 0.500 |"


@pytest.mark.parametrize("argv", [["python", "-m", "bench.floor"], ["python", "-c", "appliance"], ["python"]])
def test_the_tracer_runs_only_the_commands_the_servers_are_started_with(argv):
    with pytest.raises(SystemExit, match="expected '<python> -m appliance ...' or '<python> -m bench.lean_reference"):
        run_traced(argv)


@pytest.mark.parametrize("argv", [["--reference", "--model", "bls"], ["--reference", "--body", "grpc"]])
def test_the_reference_is_counted_only_on_what_it_serves(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert "--reference takes --body json and the identity model" in capsys.readouterr().err


def test_a_sequence_is_sent_with_its_start_on_its_first_step_and_its_end_on_its_last():
    import json

    steps = [json.loads(body) for body in sequence_bodies(length=3, sequence_id=5)]
    assert [step["parameters"] for step in steps] == [
        {"sequence_id": 5, "sequence_start": True, "sequence_end": False},
        {"sequence_id": 5, "sequence_start": False, "sequence_end": False},
        {"sequence_id": 5, "sequence_start": False, "sequence_end": True}]
    assert [step["inputs"][0]["data"] for step in steps] == [[0], [1], [2]]


@pytest.mark.parametrize("argv", [["--model", "accumulate", "--body", "binary"],
                                  ["--model", "accumulate", "--concurrency", "2"]])
def test_sequences_are_sent_one_step_at_a_time_in_json_or_grpc(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert "--model accumulate sends one sequence's steps in order, in v2 JSON or over gRPC" in capsys.readouterr().err
