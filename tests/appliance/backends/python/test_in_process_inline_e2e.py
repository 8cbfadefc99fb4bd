"""Through the daemon: a trusted Python model measured cheap runs on the event loop's own thread, and a
call to another model made from there is refused (its request fails with the reason, nothing hangs),
after which the model runs on its instance's thread and the same call succeeds."""

from __future__ import annotations

import numpy as np
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.http_util import call
from tests.models import copy_model

# backends/caller answers with the thread it ran on; an input of -1 is answered by model 'other' (BLS,
# backends/double), through a helper module, so that model.py names no call that waits.


def _infer(client: triton.InferenceServerClient, value: float) -> tuple[np.ndarray, dict]:
    tensor = triton.InferInput("IN", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.asarray([[value]], np.float32))
    result = client.infer("caller", [tensor])
    return result.as_numpy("OUT"), result.get_response().get("parameters", {})


def _execution(daemon) -> dict:
    status, _, payload = call(daemon.port, "GET", "/v2/models/caller/selection")
    assert status == 200, payload
    return payload["execution"]


def test_a_cheap_trusted_model_runs_on_the_loop_and_a_call_from_there_is_refused_not_deadlocked(
        start_daemon, tmp_path):
    repo = tmp_path / "repo"
    copy_model(repo, "backends/caller")
    copy_model(repo, "backends/double", "other", config="tensors")
    daemon = start_daemon(repo, selection=True, env={"APPLIANCE_TUNE_BUDGET": "0.05"})
    execution = _execution(daemon)
    assert execution["execution"] == "inline" and "under the GIL" in execution["reason"], execution
    with triton.InferenceServerClient(daemon.url, network_timeout=30) as client:
        out, parameters = _infer(client, 3.0)
        assert out.tolist() == [[3.0]] and parameters["thread"] == "MainThread"  # the event loop's thread

        try:
            _infer(client, -1.0)
        except InferenceServerException as error:
            assert "event loop" in str(error), error
        else:
            raise AssertionError("a call that waits for the event loop, made from it, must be refused")
        execution = _execution(daemon)
        assert execution["execution"] == "threaded" and "event loop" in execution["reason"], execution

        out, parameters = _infer(client, -1.0)  # now on the instance's thread: the call goes through
        assert out.tolist() == [[-2.0]] and parameters["thread"] != "MainThread"


# backends/always_calls calls 'other' for every request: a tuning process, which serves no other model,
# cannot measure it; its config pins the in-process plan.


def test_a_model_selection_cannot_measure_is_served_on_the_plan_it_pins(start_daemon, tmp_path):
    repo = tmp_path / "repo"
    copy_model(repo, "backends/always_calls", "caller")
    copy_model(repo, "backends/double", "other", config="tensors")
    daemon = start_daemon(repo, selection=True, env={"APPLIANCE_TUNE_BUDGET": "0.05"})
    status, _, selection = call(daemon.port, "GET", "/v2/models/caller/selection")
    assert status == 200 and selection["status"] == "unmeasured", selection
    assert selection["execution"]["execution"] == "threaded"  # nothing measured: never on the event loop
    with triton.InferenceServerClient(daemon.url, network_timeout=30) as client:
        out, parameters = _infer(client, 4.0)
    # In the daemon, on the instance's thread (a model process would run it on its own main thread).
    assert out.tolist() == [[8.0]] and parameters["thread"] == "caller:1#0"


# sequence/py_accumulator served with its in_process.pbtxt: the tests' Python accumulator (a running sum per
# direct slot), trusted, answering with the thread it ran on.


def test_a_cheap_trusted_sequence_model_runs_its_steps_on_the_loop_and_keeps_each_sequence_apart(
        start_daemon, tmp_path):
    repo = tmp_path / "repo"
    copy_model(repo, "sequence/py_accumulator", "accumulate", config="in_process")
    daemon = start_daemon(repo, selection=True, env={"APPLIANCE_TUNE_BUDGET": "0.05"})
    status, _, selection = call(daemon.port, "GET", "/v2/models/accumulate/selection")
    assert status == 200 and selection["execution"]["execution"] == "inline", selection
    steps = {7: [1, 2, 3], 8: [10, 20, 30]}
    seen: dict[int, list[int]] = {7: [], 8: []}
    threads = set()
    with triton.InferenceServerClient(daemon.url, network_timeout=30) as client:
        for position in range(3):
            for corrid, values in steps.items():  # the two sequences' steps interleave
                tensor = triton.InferInput("INPUT", [1, 1], "INT32")
                tensor.set_data_from_numpy(np.asarray([[values[position]]], np.int32))
                result = client.infer("accumulate", [tensor], sequence_id=corrid, sequence_start=position == 0,
                                      sequence_end=position == 2)
                seen[corrid].append(int(result.as_numpy("OUTPUT")[0, 0]))
                threads.add(result.get_response().get("parameters", {}).get("thread"))
    assert seen == {7: [1, 3, 6], 8: [10, 30, 60]}
    # Steps ran on the event loop's thread (threaded, every one runs on 'accumulate:1#0'). A cold daemon's
    # first steps may measure over the budget and send that batch size to the instance's thread meanwhile.
    assert "MainThread" in threads, threads
