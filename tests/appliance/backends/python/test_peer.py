"""``Peer.on_infer``: a model process's BLS call, as the daemon reads it. A well-formed call reaches the
daemon's models and its outputs go back as a ``Result``; whatever a model process sends that does not add
up (it runs the model's code, so it may send anything) is answered with an error, never left unanswered
and never raised into the channel's reader."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.backends.base import BackendServices, ModelCall, Outputs
from appliance.backends.python.peer import Peer
from appliance.backends.python.requests import OpenRequests
from appliance.backends.python.wire.arena import Attachments, inline, taken
from appliance.backends.python.wire.messages import Infer, Result


class _Models:
    """The daemon's models as a backend calls them: doubles ``IN`` at once, remembering each call."""

    def __init__(self) -> None:
        self.calls: list[ModelCall] = []

    def begin(self, call: ModelCall, then: Callable[[Outputs | None, BaseException | None], None]) -> None:
        self.calls.append(call)
        then(Outputs({"OUT": call.inputs["IN"] * 2}, {"answered": True}), None)

    def stream(self, call: ModelCall, sink: Any) -> object:
        self.calls.append(call)
        sink.send({"OUT": call.inputs["IN"] * 2}, final=True)
        return object()


def _peer(models: _Models | None) -> tuple[Peer, list[Any]]:
    sent: list[Any] = []
    requests = OpenRequests("caller", Attachments(), lambda block: None)
    return Peer("caller", sent.append, requests, BackendServices(models=models)), sent


def _inputs(values: list[float]) -> list:
    (descriptors,) = inline([[("IN", np.array(values, np.float32))]])
    return descriptors


def _meta(**changes: Any) -> dict[str, Any]:
    meta = {"model_name": "double", "model_version": -1, "outputs": ["OUT"], "id": "r1", "correlation_id": 0,
            "flags": 0, "timeout": 0, "parameters": "{}", "decoupled": False, "released": []}
    meta.update(changes)
    return meta


def test_a_call_reaches_the_models_and_its_outputs_come_back_as_its_result():
    models = _Models()
    peer, sent = _peer(models)
    peer.on_infer(Infer(7, None, _inputs([1.0, 2.0]), _meta()))
    (call,) = models.calls
    assert (call.model_name, call.outputs, call.request_id, call.parameters) == ("double", ("OUT",), "r1", {})
    (result,) = sent
    assert isinstance(result, Result) and (result.call, result.error, result.final) == (7, None, True)
    assert taken(Attachments(), result.ref, result.descriptors)["OUT"].tolist() == [2.0, 4.0]
    assert result.parameters == '{"answered": true}'


def test_a_calls_parameters_are_read_from_their_json():
    models = _Models()
    peer, _ = _peer(models)
    peer.on_infer(Infer(1, None, _inputs([1.0]), _meta(parameters='{"k": "v", "n": 3}')))
    assert models.calls[0].parameters == {"k": "v", "n": 3}


def _refusal(sent: list[Any], call: int) -> str:
    (result,) = sent
    assert isinstance(result, Result) and result.call == call and result.final and result.ref is None
    assert result.error is not None and result.error[1] == 3  # INVALID_ARG
    return result.error[0]


def test_malformed_calls_are_answered_with_what_was_wrong():
    cases = {
        "no model name": {key: value for key, value in _meta().items() if key != "model_name"},
        "parameters not JSON": _meta(parameters="{not json"),
        "parameters not an object": _meta(parameters="[1, 2]"),
        "a version that is not a number": _meta(model_version="newest"),
        "outputs that are not a list": _meta(outputs=5),
        "outputs that are not names": _meta(outputs=[1]),
        "a model name that is not a string": _meta(model_name=["double"]),
        "a correlation id that is neither number nor string": _meta(correlation_id=1.5),
        "an infinite version (found by the property below)": _meta(model_version=float("inf")),
        "infinite flags": _meta(flags=float("inf")),
        "a timeout that is not a number": _meta(timeout=float("nan")),
        "released blocks that are not a list": _meta(released=3),
    }
    for number, meta in enumerate(cases.values()):
        models = _Models()
        peer, sent = _peer(models)
        peer.on_infer(Infer(number, None, _inputs([1.0]), meta))
        assert _refusal(sent, number).startswith("invalid BLS request: ")
        assert models.calls == []


def test_inputs_that_do_not_add_up_are_answered_not_raised():
    models = _Models()
    peer, sent = _peer(models)
    peer.on_infer(Infer(3, None, [("IN", "FP32", (4,), -1, bytearray(4))], _meta()))  # 4 bytes for 4 floats
    assert "carries 4 bytes, not 16" in _refusal(sent, 3)
    assert models.calls == []


def test_a_meta_that_is_not_a_dict_is_answered():
    peer, sent = _peer(_Models())
    peer.on_infer(Infer(4, None, _inputs([1.0]), ["model_name", "double"]))  # type: ignore[arg-type]
    assert _refusal(sent, 4).startswith("invalid BLS request: ")


_PLAIN = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                     max_size=3),
                      max_leaves=6)
"""What a model process may pickle into a call's meta (plain data)."""


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.dictionaries(st.sampled_from(sorted(_meta())), _PLAIN, max_size=4),
       dropped=st.sets(st.sampled_from(sorted(_meta())), max_size=3))
def test_any_meta_is_either_called_or_answered_with_an_error(changes, dropped):
    meta = _meta(**changes)
    for key in dropped:
        meta.pop(key, None)
    models = _Models()
    peer, sent = _peer(models)
    peer.on_infer(Infer(9, None, _inputs([1.0]), meta))  # never raises
    if models.calls:
        (call,) = models.calls
        assert type(call.model_name) is str and type(call.request_id) is str
        assert type(call.correlation_id) in (int, str) and all(type(name) is str for name in call.outputs)
        assert type(call.parameters) is dict and type(call.model_version) is int
        (result,) = sent
        assert result.error is None and result.call == 9
    else:
        assert _refusal(sent, 9).startswith("invalid BLS request: ")
