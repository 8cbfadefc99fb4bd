"""Selection on this box with real runtimes: candidates measured, the fastest chosen, wrong ones rejected."""

from __future__ import annotations

import numpy as np
import pytest

import hardware_probe
from appliance.backends import BACKENDS, usable_cores
from appliance.runtime.state import StateDir
from appliance.selection import Hardware, Plan, Selector, enumerate_plans
from appliance.selection.plans import DEFAULT_PLAN, INSTANCE_COUNTS
from appliance.selection.selector import SelectionSettings, open_cache
from model_cache import ModelCache
from tests.appliance.selection.contexts import ONNX, onnx_context
from tests.appliance.selection.faulty import FAULTY, SLOWED
from tests.builders import cnn_model, framing_model, save, vad_like_model


@pytest.fixture(scope="module")
def report():
    return hardware_probe.probe(timeout=30)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    return save(cnn_model(), tmp_path_factory.mktemp("m") / "cnn" / "1" / "model.onnx")


def _selector(report, cache=None, **kwargs) -> Selector:
    return Selector(Hardware.of(report), cache, SelectionSettings(budget=0.05), **kwargs)


def _base(row: dict) -> str:
    return row["plan"].split("@")[0]


def _rows_of(decision: dict, base: str) -> list[dict]:
    return [c for c in decision["candidates"] if _base(c) == base]


def test_onnx_model_has_at_least_two_measured_candidates_and_the_fastest_wins(report, model_file):
    choice = _selector(report).choose(ONNX, onnx_context(model_file))
    ok = [c for c in choice.decision["candidates"] if c["status"] == "ok"]
    assert {"onnxruntime:CPU", "openvino:CPU"} <= {_base(c) for c in ok}
    # Each CPU plan in instance x thread variants that share this box's cores.
    cores = usable_cores()
    variants = {(c["instances"], c["threads"]) for c in _rows_of(choice.decision, "onnxruntime:CPU")}
    assert variants == {(n, max(1, cores // n)) for n in INSTANCE_COUNTS if n <= cores}
    assert choice.plan.id == min(ok, key=lambda c: c["latency_ms"])["plan"]
    assert all(c["max_abs_error"] is not None and c["throughput"] > 0 for c in ok)
    assert choice.decision["hardware_fingerprint"] == report.fingerprint
    assert choice.decision["objective"] == "latency"


def test_throughput_objective_picks_the_most_items_per_second(report, model_file):
    context = onnx_context(model_file, 'parameters { key: "objective" value: { string_value: "throughput" } }')
    choice = _selector(report).choose(ONNX, context)
    ok = [c for c in choice.decision["candidates"] if c["status"] == "ok"]
    assert choice.plan.id == max(ok, key=lambda c: c["throughput"])["plan"]


def test_a_plan_that_computes_wrong_numbers_is_rejected(report, model_file):
    faulty = Plan("faulty:shifted", "faulty")
    selector = _selector(report, extra_plans=(faulty,), backends=(*BACKENDS, FAULTY))
    choice = selector.choose(ONNX, onnx_context(model_file))
    row = next(c for c in choice.decision["candidates"] if c["plan"] == "faulty:shifted")
    assert row["status"] == "rejected" and "exceeds" in row["reason"]
    assert row["max_abs_error"] == pytest.approx(0.1, rel=1e-3)
    assert choice.plan.id != "faulty:shifted"


def test_pinned_reduced_precision_plan_beyond_tolerance_is_rejected(report, model_file):
    if "openvino:CPU:bf16" not in {p.id for p in enumerate_plans("onnxruntime", report, report.cpu_flags())}:
        pytest.skip("this CPU has no native bf16, so there is no bf16 plan")
    context = onnx_context(model_file, 'parameters { key: "plan" value: { string_value: "openvino:CPU:bf16" } }\n'
                                   'parameters { key: "tolerance" value: { string_value: "1e-6" } }')
    choice = _selector(report).choose(ONNX, context)
    assert {c["status"] for c in _rows_of(choice.decision, "openvino:CPU:bf16")} == {"rejected"}
    assert all(c["status"] == "skipped" and "pins" in c["reason"] for c in _rows_of(choice.decision, "openvino:CPU"))
    assert choice.plan.base == "onnxruntime:CPU"  # the reference is what is left


def test_excluded_plans_are_skipped(report, model_file):
    context = onnx_context(model_file, 'parameters { key: "exclude_plans" value: { string_value: "openvino" } }')
    choice = _selector(report).choose(ONNX, context)
    assert {c["status"] for c in _rows_of(choice.decision, "openvino:CPU")} == {"skipped"}
    assert choice.plan.base == "onnxruntime:CPU"


def test_cached_decision_is_reused_without_timing(report, model_file, tmp_path):
    cache = ModelCache(tmp_path / "cache")
    first = _selector(report, cache).choose(ONNX, onnx_context(model_file))
    second = _selector(report, cache).choose(ONNX, onnx_context(model_file))
    assert (first.cache, second.cache) == ("miss", "hit")
    assert second.decision["tuned_at"] == first.decision["tuned_at"]
    assert second.plan == first.plan
    retuned = _selector(report, cache).choose(ONNX, onnx_context(model_file), force=True)
    assert retuned.cache == "miss" and retuned.decision["tuned_at"] > first.decision["tuned_at"]


def _state(tmp_path, writable: bool = True) -> StateDir:
    return StateDir(tmp_path / "state", writable=writable, reason=None if writable else "Read-only file system")


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "tuning-child"])
def test_a_read_only_cache_serves_hits_and_measures_misses_without_storing(report, model_file, tmp_path, isolate):
    root = tmp_path / "cache"
    first = _selector(report, ModelCache(root)).choose(ONNX, onnx_context(model_file))
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    state = _state(tmp_path, writable=False)
    read_only = open_cache(root, 1 << 30, state)
    hit = _selector(report, read_only, isolate=isolate, state=state).choose(ONNX, onnx_context(model_file))
    assert hit.cache == "hit" and hit.plan == first.plan
    # Another model (a different key): measured, served, not stored, and said so.
    other = onnx_context(model_file, 'parameters { key: "objective" value: { string_value: "throughput" } }')
    miss = _selector(report, read_only, isolate=isolate, state=state).choose(ONNX, other)
    assert miss.cache == "miss" and miss.artefacts is None
    assert {c["status"] for c in miss.decision["candidates"]} >= {"ok"}
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    assert [p.kind for p in state.problems] == ["cache_not_saved"]
    assert "cnn" in state.problems[0].message and "not cached" in state.problems[0].message


def test_the_plan_cache_key_covers_every_file_the_model_reads(report, tmp_path):
    """A helper beside the versions is part of the key; another version and config.pbtxt's text are not
    (the config's parts selection depends on are keyed on their own)."""
    model_file = save(cnn_model(), tmp_path / "cnn" / "1" / "model.onnx")
    config = onnx_context(model_file).config
    selector = _selector(report)
    key = selector._key(model_file.parent, config)
    (tmp_path / "cnn" / "config.pbtxt").write_text("# comments only\n")
    save(cnn_model(), tmp_path / "cnn" / "2" / "model.onnx")
    assert selector._key(model_file.parent, config) == key
    (tmp_path / "cnn" / "lib").mkdir()
    (tmp_path / "cnn" / "lib" / "helper.py").write_text("SCALE = 1\n")
    with_helper = selector._key(model_file.parent, config)
    assert with_helper != key
    (tmp_path / "cnn" / "lib" / "helper.py").write_text("SCALE = 2\n")
    assert selector._key(model_file.parent, config) not in (key, with_helper)


def test_a_cached_decision_without_a_usable_plan_is_measured_again(report, model_file, tmp_path):
    cache = ModelCache(tmp_path / "cache")
    selector = _selector(report, cache)
    key = selector._key(model_file.parent, onnx_context(model_file).config)
    cache.store(key, {"chosen": "onnxruntime:CPU", "plan": ["not", "an", "object"]})  # a consistent entry
    state = _state(tmp_path)
    selector = _selector(report, open_cache(cache.root, 1 << 30, state), state=state)
    choice = selector.choose(ONNX, onnx_context(model_file))
    assert choice.cache == "miss" and choice.decision["candidates"]
    assert cache.lookup(key).decision["tuned_at"] == choice.decision["tuned_at"]  # replaced by the new one
    assert [p.kind for p in state.problems] == ["cache_entry_unreadable"]
    assert "no usable plan" in state.problems[0].message


def test_an_unreadable_cache_entry_is_reported_to_the_state_dir(report, model_file, tmp_path):
    cache = ModelCache(tmp_path / "cache")
    first = _selector(report, cache).choose(ONNX, onnx_context(model_file))
    manifest = next(cache.root.glob("*/manifest.json"))
    manifest.write_text('{"files": "wrong shape"}')
    state = _state(tmp_path)
    selector = _selector(report, open_cache(cache.root, 1 << 30, state), state=state)
    again = selector.choose(ONNX, onnx_context(model_file))
    assert again.cache == "miss" and first.cache == "miss"
    assert [p.kind for p in state.problems] == ["cache_entry_unreadable"]
    assert "removed" in state.problems[0].message


def test_a_model_that_refuses_one_sample_is_measured_on_a_size_it_accepts(report, tmp_path):
    """Silero VAD's shape: reflect padding refuses 1 and 16 samples; 512 is measured."""
    model_file = save(vad_like_model(pad=64), tmp_path / "vad" / "1" / "model.onnx")
    choice = _selector(report).choose(ONNX, onnx_context(model_file))
    decision = choice.decision
    assert not choice.unmeasured and decision["status"] == "measured" and decision["tuned_on"] == "synthetic"
    assert decision["profile"] == [{"batch": 1, "shapes": {"input": [512, 512], "state": [2, 512, 128], "sr": []}}]
    assert [r["inputs"] for r in decision["inputs_refused"]] == ["synthetic inputs, variable dimensions 1",
                                                                 "synthetic inputs, variable dimensions 16"]
    assert any(c["status"] == "ok" for c in decision["candidates"])


def test_a_model_that_refuses_every_synthetic_input_is_unmeasured_not_refused(report, tmp_path):
    model_file = save(framing_model(frame=480), tmp_path / "frames" / "1" / "model.onnx")
    cache = ModelCache(tmp_path / "cache")
    choice = _selector(report, cache).choose(ONNX, onnx_context(model_file))
    decision = choice.decision
    assert choice.unmeasured and decision["status"] == "unmeasured" and decision["chosen"] is None
    assert choice.plan == Plan(DEFAULT_PLAN, "onnxruntime")  # what --no-selection serves
    assert "no candidate plan could be measured" in decision["reason"] and "model_warmup" in decision["fix"]
    assert len(decision["inputs_refused"]) == 4  # 1, 16, 512 and 16000 samples: none is whole 480-sample frames
    assert all(c["status"] in ("failed", "skipped") for c in decision["candidates"])
    again = _selector(report, cache).choose(ONNX, onnx_context(model_file))
    assert (again.cache, again.plan, again.unmeasured) == ("hit", choice.plan, True)


def test_model_warmup_data_is_what_the_model_is_tuned_on(report, tmp_path):
    model_file = save(framing_model(frame=480), tmp_path / "frames" / "1" / "model.onnx")
    (tmp_path / "frames" / "warmup").mkdir()
    audio = np.random.default_rng(1).standard_normal((1, 4800)).astype(np.float32)
    (tmp_path / "frames" / "warmup" / "speech.raw").write_bytes(audio.tobytes())
    context = onnx_context(model_file, """model_warmup [ { name: "speech" batch_size: 1 inputs [ { key: "audio"
        value: { data_type: TYPE_FP32 dims: [ 1, 4800 ] input_data_file: "speech.raw" } } ] } ]""")
    decision = _selector(report).choose(ONNX, context).decision
    assert decision["status"] == "measured" and decision["tuned_on"] == "warmup"
    assert decision["profile"] == [{"batch": 1, "shapes": {"audio": [1, 4800]}}]
    assert decision["inputs_refused"] == []


EXPLICIT_INSTANCES = 'instance_group [ { count: 2 kind: KIND_CPU } ]\n'
TUNE_INSTANCES = 'parameters { key: "tune_instances" value: { string_value: "true" } }\n'


def test_a_pinned_plan_serves_where_it_measured_even_when_the_reference_is_faster(report, model_file):
    slowed = Plan("slowed:CPU", "slowed")
    context = onnx_context(model_file, 'parameters { key: "plan" value: { string_value: "slowed:CPU" } }')
    choice = _selector(report, extra_plans=(slowed,), backends=(*BACKENDS, SLOWED)).choose(ONNX, context)
    rows = [c for c in choice.decision["candidates"] if c["status"] == "ok"]
    assert rows[1:] and all(_base(c) == "slowed:CPU" for c in rows[1:])  # its variants, after the reference
    assert all(rows[0]["latency_ms"] < c["latency_ms"] for c in rows[1:])  # the reference was faster...
    assert choice.plan.base == "slowed:CPU" and choice.measured  # ...and the pin serves all the same


def test_a_pinned_plan_that_fails_leaves_the_reference_serving(report, model_file):
    faulty = Plan("faulty:shifted", "faulty")
    context = onnx_context(model_file, 'parameters { key: "plan" value: { string_value: "faulty:shifted" } }')
    choice = _selector(report, extra_plans=(faulty,), backends=(*BACKENDS, FAULTY)).choose(ONNX, context)
    assert choice.plan.id == choice.decision["candidates"][0]["plan"] != "faulty:shifted"


@pytest.mark.parametrize("config, explicit, varied", [
    ("", False, True),  # no instance_group: Triton's default is only a default
    (EXPLICIT_INSTANCES, True, False),  # the user's choice
    (EXPLICIT_INSTANCES + TUNE_INSTANCES, True, True),  # ... unless the user opts in
])
def test_an_explicit_instance_group_is_kept_unless_the_config_asks_for_tuning(report, model_file, config,
                                                                               explicit, varied):
    plans, _ = _selector(report).plans_for(ONNX, onnx_context(model_file, config).config, explicit)
    cpu = [p for p in plans if p.base == "onnxruntime:CPU"]
    if varied:
        assert {p.instances for p in cpu} == {n for n in INSTANCE_COUNTS if n <= usable_cores()}
    else:
        assert [(p.id, p.instances, p.threads) for p in cpu] == [("onnxruntime:CPU", 0, 0)]


def test_a_plan_pinned_with_its_variant_is_the_only_one_measured(report, model_file):
    pinned = f"openvino:CPU@1x{usable_cores()}"
    context = onnx_context(model_file, f'parameters {{ key: "plan" value: {{ string_value: "{pinned}" }} }}')
    plans, skipped = _selector(report).plans_for(ONNX, context.config)
    assert [p.id for p in plans][1:] == [pinned]  # after the reference
    assert all("pins" in reason for plan, reason in skipped.items() if plan.startswith("openvino:CPU@"))
