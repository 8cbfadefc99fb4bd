"""RequestPlan: what a front end keeps of a request decoded in full makes the same request again from new
tensor bytes, each time with dicts of its own; a request with shared memory gets no plan."""

from __future__ import annotations

import numpy as np

from appliance.engine.tensor_checks import DecodeLimits
from appliance.engine.types import InferInput, InferRequest, RequestedOutput, SharedMemoryInput, SharedMemoryRef
from appliance.protocol.request_plan import KnownBytes, PlannedInput, RequestPlan

LIMITS = DecodeLimits()


def _request(**fields) -> InferRequest:
    inputs = [InferInput("A", "FP32", np.arange(6, dtype=np.float32).reshape(2, 3)),
              InferInput("B", "BYTES", np.array([b"x", b"yz"], dtype=object))]
    return InferRequest(inputs, [RequestedOutput("OUT", {"binary_data": True})], "id-1", {"p": 1}, **fields)


def test_a_fixed_size_input_is_viewed_from_new_bytes_and_a_bytes_one_left_to_the_front_end():
    plan = RequestPlan.of(_request(), LIMITS)
    assert plan is not None
    fixed, text = plan.inputs
    assert (fixed.shape, fixed.count, fixed.dtype, fixed.nbytes) == ((2, 3), 6, np.dtype(np.float32), 24)
    assert (text.dtype, text.nbytes, text.count) == (None, 0, 2)
    data = np.full(6, 7, np.float32).tobytes()
    view = fixed.view(b"head" + data, 4)
    assert view.shape == (2, 3) and (view == 7).all() and not view.flags.writeable


def test_each_request_made_has_dicts_of_its_own():
    plan = RequestPlan.of(_request(), LIMITS)
    assert plan is not None
    first = plan.request([])
    first.parameters["added"] = True
    first.outputs[0].parameters["added"] = True
    second = plan.request([])
    assert (second.id, second.parameters, second.outputs[0].parameters) == ("id-1", {"p": 1}, {"binary_data": True})


def test_a_request_with_shared_memory_gets_no_plan():
    region = SharedMemoryRef("r", 24)
    assert RequestPlan.of(_request(shared_inputs=[SharedMemoryInput("C", "FP32", (2, 3), region)]), LIMITS) is None
    request = _request()
    request.outputs[0].shared_memory = region
    assert RequestPlan.of(request, LIMITS) is None


def test_an_input_is_planned_from_the_decoded_tensor():
    tensor = InferInput("X", "INT8", np.zeros((0, 4), np.int8))
    assert PlannedInput.of(tensor) == PlannedInput("X", "INT8", (0, 4), 0, np.dtype(np.int8), 0)


def test_known_bytes_plan_the_second_time_in_a_row_and_only_for_data_that_starts_with_them():
    known: KnownBytes[str] = KnownBytes()
    made: list[bytes] = []

    def make(key: bytes) -> str:
        made.append(key)
        return "plan"
    known.saw(b"head", lambda: make(b"head"))
    assert known.plan(b"head+tensors") is None and made == []  # once: remembered only
    known.saw(b"head", lambda: make(b"head"))
    assert known.plan(b"head+tensors") == "plan" and made == [b"head"]
    assert known.plan(b"head+tensors", 4) == "plan" and known.plan(b"head+tensors", 5) is None
    assert known.plan(b"other") is None
    known.saw(b"head", lambda: make(b"again"))  # a plan made is kept, not made again
    assert made == [b"head"]
    known.saw(b"else", lambda: make(b"else"))  # other bytes: the plan goes, they are remembered
    assert known.plan(b"head+tensors") is None
    known.saw(b"else", lambda: None)  # the second time, and no plan can take them: none is asked again
    known.saw(b"else", lambda: make(b"else"))
    assert known.plan(b"else") is None and made == [b"head"]
    known.forget()
    known.saw(b"else", lambda: make(b"else"))
    assert known.plan(b"else") is None and made == [b"head"]
