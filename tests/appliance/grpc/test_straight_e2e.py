"""ModelInfer on the data plane's straight line (``InferenceService._straight``): a call whose client
goes away (its deadline passed: the client resets the stream) takes its request back wherever it is,
and lets go of what it held; the awaited path still serves what the line does not take."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from tests.http_util import call
from tests.waiting import wait_until


def _sleeping(seconds: float) -> list[triton.InferInput]:
    tensor = triton.InferInput("x", [2], "FP32")
    tensor.set_data_from_numpy(np.array([seconds, 0.0], np.float32))
    return [tensor]


def _counts(daemon) -> tuple[int, int]:
    status, _, stats = call(daemon.port, "GET", "/v2/models/sleepy/stats")
    assert status == 200
    inference = stats["model_stats"][0]["inference_stats"]
    return inference["success"]["count"], inference["fail"]["count"]


def test_a_running_call_whose_deadline_passes_lets_go_of_its_admission(start_daemon, sleepy_repository):
    daemon = start_daemon(sleepy_repository, env={"APPLIANCE_MAX_CONCURRENT_REQUESTS": "1"})
    with triton.InferenceServerClient(daemon.grpc_url) as client:
        with pytest.raises(InferenceServerException) as excinfo:
            client.infer("sleepy", _sleeping(1.5), client_timeout=0.5)
        assert excinfo.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        # Withdrawn: counted as failed, and the one admission place is free again (the next call then
        # waits for the model's instance).
        wait_until(lambda: _counts(daemon)[1] == 1, timeout=30, what="the withdrawn call to count as failed")
        answer = client.infer("sleepy", _sleeping(0.0), client_timeout=30)
        assert answer.as_numpy("y").tolist() == [0.0, 0.0]
        assert _counts(daemon) == (1, 1)


def test_a_queued_call_whose_deadline_passes_never_runs(start_daemon, sleepy_repository):
    daemon = start_daemon(sleepy_repository)
    with triton.InferenceServerClient(daemon.grpc_url) as client:
        first = client.async_infer("sleepy", _sleeping(1.0), callback=lambda **_: None, client_timeout=30)
        wait_until(lambda: "sleepy: sleeping 1 s" in daemon.log(), timeout=30, what="the first call to run")
        client.async_infer("sleepy", _sleeping(0.5), callback=lambda **_: None, client_timeout=30)  # behind it
        # The model process takes a second request while it runs one (pipeline_depth 2), and requests read
        # in one turn go to it together: the third must come a turn later, to queue behind the second.
        time.sleep(0.2)
        outcomes: list[object] = []
        client.async_infer("sleepy", _sleeping(0.25), callback=lambda result, error: outcomes.append(error),
                           client_timeout=0.3)
        wait_until(lambda: outcomes, timeout=30, what="the third call's deadline")
        assert outcomes[0].status() == "StatusCode.DEADLINE_EXCEEDED"
        wait_until(lambda: _counts(daemon)[0] == 2, timeout=30, what="the first two calls")
        del first
        answer = client.infer("sleepy", _sleeping(0.0), client_timeout=30)
        assert answer.as_numpy("y").tolist() == [0.0, 0.0]
    assert "sleepy: sleeping 0.25 s" not in daemon.log()


def test_a_refused_call_gets_its_status_and_an_unknown_model_the_awaited_path(start_daemon, sleepy_repository):
    daemon = start_daemon(sleepy_repository)
    with triton.InferenceServerClient(daemon.grpc_url) as client:
        wrong = triton.InferInput("z", [2], "FP32")
        wrong.set_data_from_numpy(np.zeros(2, np.float32))
        with pytest.raises(InferenceServerException, match="'z'") as excinfo:
            client.infer("sleepy", [wrong])
        assert excinfo.value.status() == "StatusCode.INVALID_ARGUMENT"
        with pytest.raises(InferenceServerException, match="nowhere") as excinfo:
            client.infer("nowhere", _sleeping(0.0))
        assert excinfo.value.status() in ("StatusCode.NOT_FOUND", "StatusCode.UNAVAILABLE")
        assert client.infer("sleepy", _sleeping(0.0)).as_numpy("y").tolist() == [0.0, 0.0]


def test_a_straight_model_is_served_without_the_awaited_path(serve_in_process, tmp_path, awaited_requests):
    from tests.models import copy_model

    copy_model(tmp_path, "simple/sleepy")
    server = serve_in_process(tmp_path, grpc=True)
    with triton.InferenceServerClient(server.grpc_url) as client:
        for _ in range(3):
            assert client.infer("sleepy", _sleeping(0.0)).as_numpy("y").tolist() == [0.0, 0.0]
        with pytest.raises(InferenceServerException, match="nowhere"):
            client.infer("nowhere", _sleeping(0.0))
    assert awaited_requests == ["ModelInfer RPC"]  # the unknown model only


_WIDE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", np.arange(int(pb_utils.get_input_tensor_by_name(r, "N").as_numpy()[0]), dtype=np.float32))])
            for r in requests]
"""


def test_a_call_whose_message_came_whole_is_served_without_a_task(serve_in_process, tmp_path, monkeypatch,
                                                                   awaited_requests):
    # tritonclient writes a small unary call's headers and message together: the call is begun at the end
    # of the read that brought them (Call.start_pending), with no task; other RPCs keep theirs, and so does
    # a message larger than a stream's first window (it comes once the call is admitted).
    from appliance.grpc.http2.call import STREAM_WINDOW, Call

    (tmp_path / "wide" / "1").mkdir(parents=True)
    (tmp_path / "wide" / "1" / "model.py").write_text(_WIDE)
    (tmp_path / "wide" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\ninput [ { name: "N" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')
    tasks: list[bytes] = []
    run = Call._run

    def counted(self, handler):
        tasks.append(self.request.path)
        return run(self, handler)

    monkeypatch.setattr(Call, "_run", counted)
    server = serve_in_process(tmp_path, grpc=True)
    with triton.InferenceServerClient(server.grpc_url) as client:
        # 4 floats; then 8192 (32 KiB, an answer larger than a frame: sent as the client's window allows)
        for size, width in ((4, 1), (8192, 1), (4, STREAM_WINDOW)):
            tensor = triton.InferInput("N", [width], "INT32")
            tensor.set_data_from_numpy(np.full(width, size, np.int32))
            np.testing.assert_array_equal(client.infer("wide", [tensor]).as_numpy("OUT"),
                                          np.arange(size, dtype=np.float32))
        assert client.get_model_metadata("wide").name == "wide"
    infer, metadata = b"/inference.GRPCInferenceService/ModelInfer", b"/inference.GRPCInferenceService/ModelMetadata"
    assert tasks == [infer, metadata]  # the message of 64 KiB, and the metadata
    assert awaited_requests == []


def test_a_refusal_before_the_line_ends_the_call_without_a_task(serve_in_process, tmp_path):
    from tests.models import copy_model

    copy_model(tmp_path, "simple/sleepy")
    token = "a-token-of-24-characters"
    server = serve_in_process(tmp_path, grpc=True, auth_token=token, auth_exempt_networks=[], protect_inference=True)
    with triton.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as excinfo:
            client.infer("sleepy", _sleeping(0.0))
        assert excinfo.value.status() == "StatusCode.UNAUTHENTICATED"
        for _ in range(3):  # the same header block again: its caller and passed check are kept with it
            answer = client.infer("sleepy", _sleeping(0.0), headers={"authorization": f"Bearer {token}"})
            assert answer.as_numpy("y").tolist() == [0.0, 0.0]
        for authorization in (None, "Bearer not-the-token-at-all"):  # other blocks: checked afresh
            with pytest.raises(InferenceServerException) as excinfo:
                client.infer("sleepy", _sleeping(0.0),
                             headers={"authorization": authorization} if authorization else None)
            assert excinfo.value.status() == "StatusCode.UNAUTHENTICATED"


def test_calls_with_the_same_leading_bytes_are_each_answered_with_their_own_tensors(serve_in_process, tmp_path,
                                                                                   monkeypatch):
    # tritonclient writes every call's message the same up to its tensors' bytes: from the third call on
    # the daemon decodes them from a plan (appliance.grpc.known_message); each answer is still its own.
    import appliance.grpc.service as service
    from tests.models import copy_model

    parsed = []
    parse = service.parse_uncounted
    monkeypatch.setattr(service, "parse_uncounted", lambda *args: parsed.append(args[1]) or parse(*args))
    copy_model(tmp_path, "simple/add_sub")
    server = serve_in_process(tmp_path, grpc=True)
    with triton.InferenceServerClient(server.grpc_url) as client:
        for step in range(1, 8):
            inputs = [triton.InferInput(name, [4], "FP32") for name in ("INPUT0", "INPUT1")]
            inputs[0].set_data_from_numpy(np.arange(4, dtype=np.float32) * step)
            inputs[1].set_data_from_numpy(np.full(4, step, np.float32))
            result = client.infer("add_sub", inputs, request_id="same")
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(4) * step + step)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.arange(4) * step - step)
            assert result.get_response().id == "same"
        short = triton.InferInput("INPUT0", [3], "FP32")  # the same model, a shape it does not take
        short.set_data_from_numpy(np.zeros(3, np.float32))
        # The first call's header block differs from the next ones' (HPACK): the next two teach the plan.
        assert len(parsed) == 3, parsed
        with pytest.raises(InferenceServerException, match="INPUT"):
            client.infer("add_sub", [short, inputs[1]])
