"""The box id: stable when it can be saved, used for the run when it cannot."""

from __future__ import annotations

import uuid

import pytest

from appliance.mdns.identity import box_id
from appliance.runtime.state import StateDir
from tests.readonly import unwritable


def test_a_box_id_that_cannot_be_saved_is_used_for_this_run(tmp_path):
    state = StateDir.check(unwritable(tmp_path))
    assert uuid.UUID(box_id(state.path, state))
    assert [p.kind for p in state.problems] == ["read_only", "device_id_not_saved"]
    with pytest.raises(OSError):
        box_id(state.path)  # no one to tell: the caller hears of it


def test_a_saved_box_id_is_read_back(tmp_path):
    state = StateDir.check(tmp_path)
    first = box_id(tmp_path, state)
    assert box_id(tmp_path, state) == first and not state.problems
