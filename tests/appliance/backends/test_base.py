"""The default run_requests every tensor runtime inherits: one concatenated run per batch."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.backends import Backend, BackendRequest, BatchResult
from appliance.backends.base import model_parameters
from appliance.core.errors import InferenceFailed


class Doubler(Backend):
    """y = 2x, z = x + 1; records the batches it is given."""

    def __init__(self, rows: int | None = None) -> None:
        self.calls: list[tuple[dict, list[str]]] = []
        self.rows = rows

    def inputs(self):
        return None

    def outputs(self):
        return None

    def run(self, inputs, outputs):
        self.calls.append((dict(inputs), list(outputs)))
        x = inputs["x"]
        out = {"y": x * 2, "z": x + 1}
        if self.rows is not None:  # a model that ignores the batch dimension
            out["y"] = out["y"][: self.rows]
        return {name: out[name] for name in outputs}


def _request(values, outputs=("y",), **extra):
    return BackendRequest({"x": np.array(values, dtype=np.float32).reshape(-1, 1)}, outputs, size=len(values),
                          **extra)


def test_a_batch_runs_once_concatenated_and_each_request_gets_its_rows_and_outputs():
    backend = Doubler()
    batch = backend.run_requests([_request([1, 2]), _request([3], outputs=("z",)), _request([4], ("y", "z"))])
    assert isinstance(batch, BatchResult) and len(backend.calls) == 1
    fed, asked = backend.calls[0]
    assert fed["x"].ravel().tolist() == [1, 2, 3, 4] and asked == ["y", "z"]  # every asked output, once
    first, second, third = batch.results
    assert first["y"].ravel().tolist() == [2, 4] and list(first) == ["y"]
    assert second["z"].ravel().tolist() == [4] and list(second) == ["z"]
    assert third["y"].ravel().tolist() == [8] and third["z"].ravel().tolist() == [5]
    assert batch.input_ns >= 0 and batch.output_ns >= 0


def test_one_request_is_passed_through_without_copies():
    backend = Doubler()
    request = _request([5])
    (result,) = backend.run_requests([request]).results
    assert backend.calls[0][0]["x"] is request.inputs["x"]
    assert result["y"].ravel().tolist() == [10]


def test_outputs_that_do_not_follow_the_batch_fail_the_batch_with_the_fix():
    with pytest.raises(InferenceFailed, match="set max_batch_size: 0"):
        Doubler(rows=1).run_requests([_request([1]), _request([2])])


_KEYS = st.sampled_from(["sequence_id", "sequence_start", "priority", "timeout", "headers", "binary_data_output",
                         "shared_memory_region", "triton_x", "mode", "n", "sequence", "timeouts"])


@given(st.lists(st.dictionaries(_KEYS, st.integers(0, 3) | st.text(max_size=3), max_size=5), min_size=1,
                max_size=6))
def test_a_requests_own_parameters_are_its_keys_but_the_transports_whatever_came_before(requests):
    for parameters in requests * 2:  # each key set twice: the second time it is known
        own = {key: value for key, value in parameters.items()
               if key not in {"priority", "timeout", "headers"}
               and not key.startswith(("shared_memory_", "binary_data", "sequence_", "triton_"))}
        assert json.loads(model_parameters(parameters)) == own
