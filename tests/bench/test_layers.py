"""bench.layers' own pieces: py-spy's collapsed stacks go to the layer of their innermost frame that names
one (a model process's to the model or the hop's model side), and the budgets add up to bench.lean's
target over the reference."""

from __future__ import annotations

import pytest

from bench.layers import LAYERS, budgets, classify, layer_shares
from bench.lean import TARGET

_DAEMON = 'process 10:"python -m appliance serve --host 127.0.0.1"'
_STUB = 'process 11:"python -m appliance.backends.python.model_process.stub 16,19 /r/identity/1/model.py 10"'
_LOOP = "main (appliance/cli.py:104);run (appliance/runtime/event_loop.py:42);Runner.run (asyncio/runners.py:118)"


@pytest.mark.parametrize(("frames", "layer"), [
    ([], "event loop"),
    (["LaneConnection.data_received (appliance/rest/lane_connection.py:134)"], "HTTP framing"),
    (["InferLane.answer (appliance/rest/lane.py:120)", "decode_infer_request (appliance/rest/codec.py:250)",
      "array (numpy/_core/numeric.py:10)"], "decode"),
    (["InferLane.answer (appliance/rest/lane.py:120)", "encode_answer (appliance/rest/codec.py:561)"], "encode"),
    (["_Straight.landed (appliance/rest/lane.py:238)", "plain_answer (appliance/rest/codec.py:724)"], "encode"),
    (["_Straight.landed (appliance/rest/lane.py:238)", "_binary_answer (appliance/rest/codec.py:651)"], "encode"),
    (["_binary_answer (appliance/rest/codec.py:651)", "_binary_choice.<locals>.binary (appliance/rest/codec.py:580)"],
     "encode"),
    (["InferLane.answer (appliance/rest/lane.py:120)"], "routing and admission"),
    (["dispatch (appliance/engine/scheduler/execution.py:201)"], "scheduling"),
    (["dispatch (appliance/engine/scheduler/execution.py:201)",
      "PythonBackend.start_requests (appliance/backends/python/backend.py:303)"], "hop, server side"),
    (["ModelStats.record (appliance/engine/stats.py:40)"], "statistics"),
    (["Http2Connection.data_received (appliance/grpc/http2/connection.py:159)"], "HTTP framing"),
    (["Http2Connection.data_received (appliance/grpc/http2/connection.py:159)",
      "AdmittingHandlers._straight_infer (appliance/grpc/admission.py:254)"], "routing and admission"),
    (["_StraightInfer.landed (appliance/grpc/service.py:143)",
      "serialize_infer_response (appliance/grpc/codec.py:335)"], "encode"),
    (["InferMessage.decode (appliance/grpc/service.py:109)", "_Plan.decode (appliance/grpc/known_message.py:57)"],
     "decode"),
])
def test_a_daemon_sample_goes_to_its_innermost_layer(frames, layer):
    assert classify(_DAEMON, [*_LOOP.split(";"), *frames]) == layer


def test_a_model_process_sample_is_the_model_or_the_hop():
    assert classify(_STUB, ["main (appliance/backends/python/model_process/stub.py:90)"]) == "hop, model side"
    assert classify(_STUB, ["main (appliance/backends/python/model_process/stub.py:90)",
                            "TritonPythonModel.execute (model.py:6)"]) == "execution"
    assert classify('process 3:"python -m bench.lean_model /m/1/model.py {} 4 5"',
                    ["main (bench/lean_model.py:98)", "split_frames (bench/lean_model.py:40)"]) == "hop, model side"


def test_the_reference_server_s_own_frames():
    reference = 'process 2:"python -m bench.lean_reference --port 0"'
    root = ["main (bench/lean_reference.py:420)", "_serve (bench/lean_reference.py:400)"]
    assert classify(reference, root) == "event loop"
    request = [*root, "_Connection.on_message_complete (bench/lean_reference.py:370)",
               "_Server._infer (bench/lean_reference.py:320)"]
    assert classify(reference, request) == "routing and admission"
    assert classify(reference, [*request, "decode (bench/lean_reference.py:150)"]) == "decode"
    assert classify(reference, [*root, "_Hop.received (bench/lean_reference.py:270)",
                                "split_frames (bench/lean_model.py:40)"]) == "hop, server side"


def test_shares_count_a_child_under_its_own_label():
    raw = (f"{_DAEMON};{_LOOP};LaneConnection.data_received (appliance/rest/lane_connection.py:134) 3\n"
           f"{_DAEMON};{_STUB};main (appliance/backends/python/model_process/stub.py:90) 1\n")
    shares = layer_shares(raw)
    assert shares["HTTP framing"] == 0.75 and shares["hop, model side"] == 0.25 and set(shares) == set(LAYERS)


def test_the_budgets_add_up_to_the_target():
    reference = dict.fromkeys(LAYERS, 10.0) | {"scheduling": 0.0, "statistics": 0.0}
    plan = budgets(reference)
    assert plan["decode"] == 12.5
    assert sum(plan.values()) == pytest.approx(TARGET * sum(reference.values()))
