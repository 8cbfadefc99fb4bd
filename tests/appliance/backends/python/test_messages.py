"""The messages between the daemon and a model process (appliance.backends.python.wire.messages): every
kind crosses the channel as itself, and what is not one of the kinds is refused, on sending and on
receiving, with an error that says so; a model process that sends a pickled class runs nothing in the
daemon, and is stopped."""

from __future__ import annotations

import logging
import os
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.backends.base import BackendRequest
from appliance.backends.python.wire import messages as m
from appliance.backends.python.wire.channel import Channel
from appliance.core.errors import InferenceFailed
from tests.appliance.backends.python.harness import loaded
from tests.models import copy_model, read_config

_REF = (3, "/dev/shm/appliance-block-x", 65536)
_DESCRIPTORS: m.Descriptors = [("OUTPUT0", "FP32", (1, 4), 0, 16)]
_EXAMPLES: dict[type, m.Message] = {
    m.Describe: m.Describe({"name": "x", "max_batch_size": 8}),
    m.Described: m.Described({"name": "x", "input": [{"name": "IN", "dims": [4]}]}),
    m.Initialize: m.Initialize({"model_config": "{}", "model_instance_name": "x_0"}),
    m.Ready: m.Ready(),
    m.Execute: m.Execute({"path": "/dev/shm/a", "size": 4096}, [{"key": 1, "inputs": _DESCRIPTORS, "flags": 0}]),
    m.ExecuteEach: m.ExecuteEach({"path": "/dev/shm/a", "size": 4096}, [{"key": 1}, {"key": 2}]),
    m.Done: m.Done({"path": "/dev/shm/b", "size": 4096},
                   [m.Produced(_DESCRIPTORS, "{}"), m.Errored("negative", 3), m.Sent(), m.Rescheduled(),
                    m.Failed("RuntimeError: no", "Traceback ...")]),
    m.Failed: m.Failed("RuntimeError: no", "Traceback (most recent call last): ..."),
    m.Finalize: m.Finalize(),
    m.Finalized: m.Finalized(),
    m.Crashed: m.Crashed("ImportError: x", "Traceback ..."),
    m.Handover: m.Handover(),
    m.HandedOver: m.HandedOver(),
    m.Free: m.Free([1, 2, 3]),
    m.Infer: m.Infer(7, _REF, _DESCRIPTORS, {"model_name": "other", "outputs": ["OUT"], "released": [4]}),
    m.Result: m.Result(7, _REF, _DESCRIPTORS, None, '{"p": 1}', True),
    m.Cancel: m.Cancel(7),
    m.Ask: m.Ask(8, "model_ready", ("other", "1")),
    m.Answer: m.Answer(8, True, 1.5),
    m.Gone: m.Gone(8, "the server went away"),
    m.Response: m.Response(5, None, [], ("failed", 1), None, True),
    m.Log: m.Log(20, "hello", "model.py", 12),
    m.MetricUpdate: m.MetricUpdate("increment", 2, 1.0),
}


@pytest.fixture
def channel():
    """Both ends of a channel, in this process."""
    ours, theirs = Channel.pair()
    other = Channel(*theirs)
    yield ours, other
    ours.close()
    other.close()


def test_every_kind_has_an_example():
    assert set(_EXAMPLES) == set(m.KINDS)


@pytest.mark.parametrize("kind", m.KINDS, ids=lambda kind: kind.__name__)
def test_every_kind_crosses_the_channel_as_itself(channel, kind):
    ours, other = channel
    ours.send_bytes(m.encode(_EXAMPLES[kind]))
    received = m.decode(other.recv_bytes())
    assert type(received) is kind and received == _EXAMPLES[kind]


def test_the_entries_of_a_done_reply_keep_their_kinds(channel):
    ours, other = channel
    ours.send_bytes(m.encode(_EXAMPLES[m.Done]))
    received = m.decode(other.recv_bytes())
    assert isinstance(received, m.Done) and received.packed is not None
    assert [type(entry) for entry in received.packed] == [m.Produced, m.Errored, m.Sent, m.Rescheduled, m.Failed]


def test_kinds_without_fields_stay_apart():
    """Equal as tuples (all empty): the class, not the value, tells them apart."""
    kinds = [type(m.decode(m.encode(kind()))) for kind in (m.Ready, m.Finalize, m.Finalized, m.Handover,
                                                           m.HandedOver)]
    assert kinds == [m.Ready, m.Finalize, m.Finalized, m.Handover, m.HandedOver]


@pytest.mark.parametrize("message", [("ready", None), ["ready"], "ready", m.Produced([], "{}")],
                         ids=["tagged tuple", "list", "string", "an entry alone"])
def test_sending_what_is_not_a_message_is_refused(message):
    with pytest.raises(m.MessageRefused, match="is not a message of the model-process channel; send one of"):
        m.encode(message)


class _Runs:
    """Would run os.system at unpickling, were classes resolved."""

    def __reduce__(self):
        return (os.system, ("exit 3",))


@pytest.mark.parametrize(("frame", "refusal"), [
    (pickle.dumps(("ready", None)), "not a message of a known kind"),
    (pickle.dumps((len(m.KINDS), 1)), "not a message of a known kind"),
    (pickle.dumps((True,)), "not a message of a known kind"),
    (pickle.dumps((m.KINDS.index(m.Cancel), 1, 2)), "a Cancel message has 1 fields, not 2"),
    (pickle.dumps((m.KINDS.index(m.Done), None, [("ok", [], "{}")])), "not a Done entry of a known kind"),
    (pickle.dumps((m.KINDS.index(m.Done), None, [(m.ENTRIES.index(m.Produced) == 0, [], "{}")])),
     "not a Done entry of a known kind"),
    (pickle.dumps((m.KINDS.index(m.Done), None, [(m.ENTRIES.index(m.Produced), [], "{}", 1)])),
     "a Produced Done entry has 2 fields, not 3"),
    (pickle.dumps((m.KINDS.index(m.Done), None, ((m.ENTRIES.index(m.Produced), [], "{}"),))),
     "a Done message's entries are not a list"),
    (pickle.dumps((m.KINDS.index(m.Answer), 1, True, _Runs())), "holds plain data only, not posix.system"),
    (pickle.dumps(m.Ready()), "holds plain data only, not appliance.backends.python.wire.messages.Ready"),
    (b"\x80\x05garbage", "is not a message"),
], ids=["tagged tuple", "unknown number", "bool for a number", "fields", "entry", "bool for an entry's number",
        "an entry's fields", "entries not a list", "a class", "pickled class", "not a pickle"])
def test_a_frame_that_is_not_a_message_is_refused(channel, frame, refusal):
    ours, other = channel
    ours.send_bytes(frame)
    with pytest.raises(m.MessageRefused, match=refusal):
        m.decode(other.recv_bytes())


def test_a_model_process_that_sends_a_class_runs_nothing_in_the_daemon_and_is_stopped(tmp_path, caplog):
    model = copy_model(tmp_path, "backends/sends_a_class")
    caplog.set_level(logging.ERROR, logger="appliance.backends.python.process")
    with loaded(model, read_config("backends/sends_a_class")) as backend:
        (failed,) = backend.run_requests([BackendRequest({"IN": np.array([1], np.float32)}, ("OUT",))]).results
        assert isinstance(failed, InferenceFailed) and "exited with code" in failed.message
        assert "sent a frame that is not a message, so its process is stopped" in caplog.text
        assert "plain data only, not posix.system" in caplog.text
        assert not (tmp_path / "sends_a_class" / "ran").exists()  # os.system never ran
        (answered,) = backend.run_requests([BackendRequest({"IN": np.array([2], np.float32)}, ("OUT",))]).results
        assert isinstance(answered, dict) and answered["OUT"].tolist() == [2.0]  # started again


_PLAIN = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.binary(max_size=8),
                      lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(frame=st.one_of(st.binary(max_size=256),
                       st.builds(lambda number, rest: pickle.dumps((number, *rest)),
                                 st.integers(-2, len(m.KINDS) + 2), st.lists(_PLAIN, max_size=6)),
                       st.builds(lambda entries: pickle.dumps((m.KINDS.index(m.Done), None, entries)),
                                 st.lists(st.tuples(st.integers(-1, len(m.ENTRIES)), _PLAIN, _PLAIN) | _PLAIN,
                                          max_size=3))))
def test_any_frame_is_a_message_of_a_known_kind_or_refused(frame):
    """A model process writes whatever it likes into the channel: the daemon gets one of the kinds, whole,
    or MessageRefused, never another exception."""
    try:
        message = m.decode(frame)
    except m.MessageRefused:
        return
    assert type(message) in m.KINDS and len(message) == len(type(message)._fields)
    if type(message) is m.Done and message.packed is not None:  # its entries typed too, each whole
        assert all(type(entry) in m.ENTRIES and len(entry) == len(type(entry)._fields) for entry in message.packed)
