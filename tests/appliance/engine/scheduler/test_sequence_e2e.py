"""Stateful models through the daemon with tritonclient (HTTP, gRPC and its stream): both strategies,
every control form, numeric and string IDs, Triton's errors, idle reaping, implicit state against an
in-process onnxruntime loop, a Python model, statistics and metrics."""

from __future__ import annotations

import queue
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from appliance.examples.sequence import (
    FRAME,
    accumulator_config,
    accumulator_model,
    vad_config,
    vad_state_model,
    write_sequence_model,
)
from tests.http_util import call
from tests.models import write_python_model
from tests.models.sequence import (
    PY_ACCUMULATOR,
    PY_ACCUMULATOR_CONFIG,
    write_triton_examples,
)
from tests.waiting import wait_until

ACCUMULATORS = {
    # name: (strategy, control form, corrid datatype, instances)
    "acc_direct_int32": ("direct { }", "INT32", "UINT64", 1),
    "acc_direct_fp32": ("direct { max_queue_delay_microseconds: 2000 minimum_slot_utilization: 0.5 }", "FP32",
                        None, 2),
    "acc_oldest_bool": ("oldest { max_candidate_sequences: 16 max_queue_delay_microseconds: 2000 }", "BOOL",
                        "BYTES", 1),
    "acc_oldest_int": ("oldest { max_candidate_sequences: 8 preferred_batch_size: [ 2, 4 ] }", "INT32", "INT32", 2),
}
VADS = {"vad_direct": "direct { }", "vad_oldest": "oldest { max_candidate_sequences: 16 }"}
PROTOCOLS = ["http", "grpc"]


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("sequence-repo")
    for name, (strategy, control, corrid, instances) in ACCUMULATORS.items():
        write_sequence_model(repo, name, accumulator_model(control, corrid),
                             accumulator_config(strategy, control, corrid, 8, instances))
    write_sequence_model(repo, "acc_short_idle", accumulator_model(),
                         accumulator_config("direct { }", max_batch_size=1, idle_us=200_000))
    for name, strategy in VADS.items():
        write_sequence_model(repo, name, vad_state_model(), vad_config(strategy, max_batch_size=16))
    write_python_model(repo, "py_accumulator", PY_ACCUMULATOR, PY_ACCUMULATOR_CONFIG)
    write_triton_examples(repo)
    return repo


def own_client(daemon, kind: str):
    """A client for one thread: tritonclient's HTTP client must not be shared between threads."""
    if kind == "grpc":
        return grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}")
    return httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}")


def send_alone(daemon, kind: str, model: str, corrid, values: list[int]) -> list:
    client = own_client(daemon, kind)
    try:
        return send(client, model, corrid, values)
    finally:
        client.close()


@pytest.fixture(scope="module")
def daemon(module_in_process, repository):
    return module_in_process(repository)


@pytest.fixture(scope="module")
def clients(daemon):
    """An HTTP and a gRPC client of one daemon."""
    http = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}")
    yield http, grpc
    http.close()
    grpc.close()


def _input(module, value: int):
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], np.int32))
    return tensor


def send(client, model: str, corrid, values: list[int], output: str = "OUTPUT") -> list:
    module = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    results = []
    for index, value in enumerate(values):
        result = client.infer(model, [_input(module, value)], sequence_id=corrid, sequence_start=index == 0,
                              sequence_end=index == len(values) - 1)
        results.append(result.as_numpy(output).reshape(-1)[0])
    return results


def accumulate_in_process(path, control: str, values: list[int]) -> list[int]:
    """The accumulator run alone in onnxruntime, the state carried by hand."""
    session = ort.InferenceSession(str(path))
    dtype = {"FP32": np.float32, "INT32": np.int32, "BOOL": np.bool_}[control]
    corrid = {"tensor(string)": np.array([["x"]], object), "tensor(uint64)": np.ones((1, 1), np.uint64),
              "tensor(int32)": np.ones((1, 1), np.int32)}
    extra = {i.name: corrid[i.type] for i in session.get_inputs() if i.name == "CORRID"}
    state, outputs = np.zeros((1, 1), np.int32), []
    for index, value in enumerate(values):
        feed = {"INPUT": np.array([[value]], np.int32), "ACC_IN": state, **extra,
                "START": np.array([[index == 0]], dtype), "END": np.array([[index == len(values) - 1]], dtype),
                "READY": np.array([[1]], dtype)}
        out, state = session.run(["OUTPUT", "ACC_OUT"], feed)
        outputs.append(int(out[0, 0]))
    return outputs


def test_control_and_state_tensors_are_not_client_inputs(client):
    http = client
    metadata = http.get_model_metadata("acc_direct_int32")
    assert [i["name"] for i in metadata["inputs"]] == ["INPUT"]
    assert [o["name"] for o in metadata["outputs"]] == ["OUTPUT", "END_OUT", "CORRID_OUT"]
    assert [i["name"] for i in http.get_model_metadata("vad_direct")["outputs"]] == ["prob"]
    config = http.get_model_config("acc_direct_int32")
    assert config["sequence_batching"]["control_input"][0]["name"] == "START"
    assert "sequence" in http.get_server_metadata()["extensions"]


@pytest.mark.parametrize("model", sorted(ACCUMULATORS))
def test_interleaved_concurrent_sequences_equal_each_run_alone(daemon, repository, model):
    strategy, control, corrid, _ = ACCUMULATORS[model]
    rng = np.random.default_rng(1)
    ids = [f"s-{i}" if corrid == "BYTES" else 1000 + i for i in range(12)]
    values = {c: rng.integers(-100, 100, int(rng.integers(2, 9))).tolist() for c in ids}
    with ThreadPoolExecutor(12) as pool:
        got = list(pool.map(lambda i: send_alone(daemon, "grpc" if i % 2 else "http", model, ids[i],
                                                 values[ids[i]]), range(len(ids))))
    path = repository / model / "1" / "model.onnx"
    assert [list(map(int, g)) for g in got] == [accumulate_in_process(path, control, values[c]) for c in ids]


def test_numeric_and_string_ids_reach_the_model(clients):
    http, grpc = clients
    assert send(http, "acc_direct_int32", 2**63 + 5, [1, 2], output="CORRID_OUT") == [2**63 + 5] * 2
    assert send(grpc, "acc_oldest_bool", "stream-ü", [1, 2], output="CORRID_OUT") == ["stream-ü".encode()] * 2
    assert send(http, "acc_oldest_int", 2**31 - 1, [3], output="CORRID_OUT") == [2**31 - 1]
    assert send(http, "acc_direct_int32", 77, [5, 6, 7], output="END_OUT") == [0, 0, 1]
    # A model without a CORRID control takes either kind of ID.
    assert send(grpc, "acc_direct_fp32", "any-id", [4, 4]) == [4, 8]
    assert send(http, "acc_direct_fp32", 31, [4, 4]) == [4, 8]


def _error(client, model: str, value: int = 1, **kwargs) -> str:
    module = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    with pytest.raises(InferenceServerException) as caught:
        client.infer(model, [_input(module, value)], **kwargs)
    return caught.value.message()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_protocol_errors_have_tritons_words(daemon, protocol):
    client = own_client(daemon, protocol)
    try:
        _refuse_as_triton(client)
    finally:
        client.close()


def _refuse_as_triton(client) -> None:
    model = "acc_direct_int32"
    assert _error(client, model).startswith(
        f"inference request to model '{model}' must specify a non-zero or non-empty correlation ID")
    assert _error(client, model, sequence_id=37469245).startswith(
        f"inference request for sequence 37469245 to model '{model}' must specify the START flag on the first "
        "request of the sequence")
    assert _error(client, "acc_oldest_bool", sequence_id=5, sequence_start=True).startswith(
        "sequence batching control 'CORRID' data-type is 'UINT64', but model 'acc_oldest_bool' expects 'BYTES'")
    send(client, model, 3, [1, 2])
    assert "already ended" in _error(client, model, sequence_id=3)


def test_batched_requests_are_refused_with_status_400(daemon):
    body = {"parameters": {"sequence_id": 5, "sequence_start": True},
            "inputs": [{"name": "INPUT", "shape": [2, 1], "datatype": "INT32", "data": [1, 2]}]}
    status, _, payload = call(daemon.port, "POST", "/v2/models/acc_direct_int32/infer", body)
    assert status == 400 and "must specify batch-size 1 due to requirements of sequence batcher" in payload["error"]
    body["parameters"] = {"sequence_id": {"nested": 1}}
    status, _, payload = call(daemon.port, "POST", "/v2/models/acc_direct_int32/infer", body)
    assert status == 400 and "'sequence_id' must be an unsigned integer or a string" in payload["error"]


def test_idle_sequences_are_reaped_and_say_so(client):
    http = client
    send(http, "acc_short_idle", 1, [5, 5])  # START ... END: ended normally
    http.infer("acc_short_idle", [_input(httpclient, 1)], sequence_id=2, sequence_start=True)
    wait_until(lambda: http.get_inference_statistics("acc_short_idle")["model_stats"][0]["sequence_stats"]["reaped"],
               what="the idle sequence reaped")
    message = _error(http, "acc_short_idle", sequence_id=2)
    assert message.startswith("inference request for sequence 2 to model 'acc_short_idle' must specify the START")
    assert "was ended after 200000 us without a request (max_sequence_idle_microseconds)" in message
    # The slot (there is one) was freed: a new sequence runs at once.
    assert send(http, "acc_short_idle", 3, [2, 2]) == [2, 4]
    stats = http.get_inference_statistics("acc_short_idle")["model_stats"][0]["sequence_stats"]
    assert stats["reaped"] == 1 and stats["ended"] == 2 and stats["active"] == 0


@pytest.mark.parametrize("model", sorted(VADS))
def test_implicit_state_matches_an_in_process_loop_bit_for_bit(clients, repository, model):
    http, grpc = clients
    session = ort.InferenceSession(str(repository / model / "1" / "model.onnx"))
    rng = np.random.default_rng(7)
    streams = {f"mic-{i}": rng.standard_normal((12, FRAME)).astype(np.float32) for i in range(3)}
    expected = {}
    for name, frames in streams.items():
        state, probs = np.zeros((1, 2, 128), np.float32), []
        for frame in frames:
            prob, state = session.run(["prob", "stateN"], {"input": frame[None], "state": state})
            probs.append(prob)
        expected[name] = np.concatenate(probs)
    got: dict[str, list] = {name: [] for name in streams}
    for step in range(12):  # round robin: the streams interleave, each frame answered before the next
        for name, frames in streams.items():
            tensor = grpcclient.InferInput("input", [1, FRAME], "FP32")
            tensor.set_data_from_numpy(frames[step][None])
            result = grpc.infer(model, [tensor], sequence_id=name, sequence_start=step == 0, sequence_end=step == 11)
            got[name].append(result.as_numpy("prob"))
    for name in streams:
        assert np.array_equal(np.concatenate(got[name]), expected[name]), name


def test_concurrent_streams_over_grpc_streaming_keep_their_order(clients, repository):
    _, grpc = clients
    answers: queue.Queue = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        rng = np.random.default_rng(3)
        values = {1000 + i: rng.integers(-9, 9, 10).tolist() for i in range(6)}
        for step in range(10):  # every request sent at once, without waiting for answers
            for corrid, series in values.items():
                grpc.async_stream_infer("acc_oldest_int", [_input(grpcclient, series[step])],
                                        request_id=f"{corrid}/{step}", sequence_id=corrid,
                                        sequence_start=step == 0, sequence_end=step == 9)
        got: dict[int, dict[int, int]] = {c: {} for c in values}
        for _ in range(60):
            result, error = answers.get(timeout=60)
            assert error is None, error
            corrid, step = map(int, result.get_response().id.split("/"))
            got[corrid][step] = int(result.as_numpy("OUTPUT")[0, 0])
    finally:
        grpc.stop_stream()
    assert {c: [got[c][s] for s in range(10)] for c in values} == {c: np.cumsum(v).tolist() for c, v in values.items()}


def test_a_python_model_keeps_state_per_batch_slot(daemon):
    values = {c: list(range(c, c + 6)) for c in (1, 2, 3)}
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda c: send_alone(daemon, "grpc" if c % 2 else "http", "py_accumulator", c,
                                                 values[c]), values))
    assert [list(map(int, g)) for g in got] == [np.cumsum(v).tolist() for v in values.values()]


def test_equivalents_of_tritons_examples_answer_as_its_clients_expect(clients):
    http, grpc = clients
    values = [0, 11, 7, 5, 3, 2, 0, 1]
    assert send(http, "simple_sequence", 1000, values) == [1, 11, 7, 5, 3, 2, 0, 1]
    assert send(grpc, "simple_dyna_sequence", 1001, [100] + [-v for v in values[1:]]) == [
        101, -11, -7, -5, -3, -2, 0, 1000]
    assert send(http, "simple_string_dyna_sequence", "1002", [20, -11, -7]) == [20, 9, 1004]


def test_statistics_and_metrics_count_sequences(daemon, clients):
    http, grpc = clients
    before = http.get_inference_statistics("acc_oldest_int")["model_stats"][0]["sequence_stats"]
    send(http, "acc_oldest_int", 424242, [1, 1, 1])
    after = http.get_inference_statistics("acc_oldest_int")["model_stats"][0]
    assert after["sequence_stats"]["started"] == before["started"] + 1
    assert after["sequence_stats"]["ended"] == before["ended"] + 1
    # gRPC clients parse Triton's message: the appliance's extra member is left out, nothing breaks.
    assert grpc.get_inference_statistics("acc_oldest_int").model_stats[0].inference_count == after["inference_count"]
    with urllib.request.urlopen(f"{daemon.base}/metrics", timeout=30) as response:
        text = response.read().decode()
    line = 'appliance_sequence_count{event="ended",model="acc_oldest_int",version="1"}'
    assert any(row.startswith(line) and float(row.split()[-1]) >= 1 for row in text.splitlines())
    assert 'appliance_sequence_active{model="acc_oldest_int",version="1"} 0.0' in text

