"""Trace files: Triton's JSON list, valid after every write; rotation every log_frequency traces; the
byte bound; memory only without a writable directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

from appliance.protocol.trace_writer import TraceWriter


def _trace(number: int, padding: int = 0) -> dict:
    return {"id": number, "model_name": "m", "model_version": 1,
            "timestamps": [{"name": "REQUEST_START", "ns": number}, {"name": "X" * padding, "ns": number + 1}]}


def _ids(path: Path) -> list[int]:
    return [t["id"] for t in json.loads(path.read_text())]


def test_one_file_stays_a_valid_json_list_as_traces_come(tmp_path):
    writer = TraceWriter(tmp_path / "traces")
    writer.add(_trace(1))
    writer.flush()
    path = tmp_path / "traces" / "trace.json"
    assert _ids(path) == [1]
    writer.add(_trace(2))
    writer.add(_trace(3))
    writer.flush()
    assert _ids(path) == [1, 2, 3]
    assert json.loads(path.read_text())[1] == _trace(2)
    writer.close()


def test_log_frequency_starts_a_new_numbered_file_every_n_traces(tmp_path):
    writer = TraceWriter(tmp_path, "t.json")
    for number in range(1, 6):
        writer.add(_trace(number), log_frequency=2)
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json.0", "t.json.1", "t.json.2"]
    assert [_ids(tmp_path / f"t.json.{i}") for i in range(3)] == [[1, 2], [3, 4], [5]]


def _on_disk(directory: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in directory.iterdir())


def test_the_oldest_files_are_removed_to_stay_under_the_bound_on_disk(tmp_path):
    block = os.statvfs(tmp_path).f_bsize
    writer = TraceWriter(tmp_path, max_bytes=3 * block)
    for number in range(1, 8):  # each ~1 KiB, alone in its file: a whole block each on disk
        writer.add(_trace(number, padding=1000), log_frequency=1)
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json.4", "trace.json.5", "trace.json.6"]
    assert _on_disk(tmp_path) <= 3 * block
    assert _ids(tmp_path / "trace.json.6") == [7]


def test_many_small_files_count_the_blocks_they_take(tmp_path):
    """Issue 22 (Low): trace_max_bytes counted the bytes written, 3000 one-trace files took ten times it."""
    bound = 512 * 1024
    writer = TraceWriter(tmp_path, max_bytes=bound)
    for number in range(600):
        writer.add(_trace(number), log_frequency=1)
    writer.close()
    assert _on_disk(tmp_path) <= bound
    assert _ids(tmp_path / "trace.json.599") == [599]


def test_the_number_of_files_is_bounded(tmp_path):
    writer = TraceWriter(tmp_path, max_files=5)
    for number in range(20):
        writer.add(_trace(number), log_frequency=1)
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"trace.json.{i}" for i in range(15, 20)]


def test_a_single_file_at_the_bound_takes_no_more_traces(tmp_path):
    block = os.statvfs(tmp_path).f_bsize
    size = len(json.dumps(_trace(1, padding=1000))) + 2
    writer = TraceWriter(tmp_path, max_bytes=2 * block)
    for number in range(1, 12):
        writer.add(_trace(number, padding=1000))
    writer.close()
    fits = (2 * block) // size
    assert _ids(tmp_path / "trace.json") == list(range(1, fits + 1))
    assert writer.dropped == 11 - fits
    assert _on_disk(tmp_path) <= 2 * block


def test_files_of_an_earlier_run_are_replaced(tmp_path):
    (tmp_path / "trace.json").write_text("old")
    (tmp_path / "trace.json.7").write_text("old")
    (tmp_path / "keep.txt").write_text("not a trace file")
    writer = TraceWriter(tmp_path)
    writer.add(_trace(1))
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt", "trace.json"]
    assert _ids(tmp_path / "trace.json") == [1]


def test_without_a_directory_traces_are_kept_in_memory_bounded():
    writer = TraceWriter(None, memory_traces=3)
    for number in range(1, 6):
        writer.add(_trace(number))
    writer.close()
    assert [t["id"] for t in writer.kept()] == [3, 4, 5]


def test_a_directory_that_cannot_be_written_falls_back_to_memory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the directory should be: mkdir fails
    reasons: list[str] = []
    writer = TraceWriter(blocker / "traces", on_error=reasons.append)
    writer.add(_trace(1))
    writer.close()
    assert [t["id"] for t in writer.kept()] == [1]
    assert len(reasons) == 1 and "cannot write trace files" in reasons[0]


def test_each_stream_fills_numbered_files_of_its_own(tmp_path):
    # As Triton's trace settings objects: a model with log_frequency 2 of its own writes t.json.N files
    # of two traces while the global settings' traces go on into t.json (L0_trace's global_trace.log).
    writer = TraceWriter(tmp_path, "t.json")
    for number, stream, frequency in ((1, "simple", 2), (2, "global", 0), (3, "simple", 2), (4, "other", 3),
                                      (5, "simple", 2), (6, "global", 0), (7, "other", 3)):
        writer.add(_trace(number), frequency, stream=stream)
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "t.json.0", "t.json.1", "t.json.2"]
    assert _ids(tmp_path / "t.json") == [2, 6]
    assert [_ids(tmp_path / f"t.json.{i}") for i in range(3)] == [[1, 3], [4, 7], [5]]


def test_a_counted_stream_writes_a_numbered_file_closed_when_its_count_runs_out(tmp_path):
    # L0_trace's global_count.log: 20 traces before trace_count was set stay in the file itself, the 5
    # counted ones go to global_count.log.0; a count set again starts the next number.
    writer = TraceWriter(tmp_path, "global_count.log")
    for number in range(1, 4):
        writer.add(_trace(number), stream="before")
    for number in range(4, 7):
        writer.add(_trace(number), stream="counted", counted=True, last=number == 6)
    writer.add(_trace(7), stream="again", counted=True, last=True)
    writer.close()
    assert _ids(tmp_path / "global_count.log") == [1, 2, 3]
    assert _ids(tmp_path / "global_count.log.0") == [4, 5, 6] and _ids(tmp_path / "global_count.log.1") == [7]


def test_a_file_removed_for_the_bound_is_started_again_by_its_stream(tmp_path):
    block = os.statvfs(tmp_path).f_bsize
    writer = TraceWriter(tmp_path, max_bytes=3 * block)
    writer.add(_trace(1, padding=1000), stream="g")  # trace.json, the oldest
    for number in (2, 3, 4):
        writer.add(_trace(number, padding=1000), 1, stream=number)  # trace.json.0-2: push it out
    writer.add(_trace(5, padding=1000), stream="g")
    writer.close()
    assert _ids(tmp_path / "trace.json") == [5]  # a valid list again, not an append to a removed file
    assert _on_disk(tmp_path) <= 3 * block
