"""The Redis response cache's entries without a server: they read back as stored and only under the key that
signed them, anything else is refused, the keys come from the settings or the state dir, and a response must
be the model's outputs (OutputForms) to be served."""

from __future__ import annotations

import re
import stat

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.core.errors import ConfigError
from appliance.engine.redis_entry import EntryKeys, decode_entry, encode_entry, entry_keys, open_entry
from appliance.engine.response_cache import OutputForms
from appliance.runtime.state import StateDir
from appliance.settings import load_settings
from tests.builders import mixed_outputs

KEYS = EntryKeys.of(b"k" * 32, shared=True)
KEY = b"appliance:rc2:00ff"
SECRET = "a shared secret of at least 32 characters"


def _read(value: bytes, key: bytes = KEY, keys: EntryKeys = KEYS):
    return decode_entry(open_entry(key, value, keys))


def test_an_entry_reads_back_as_stored():
    outputs = mixed_outputs()
    stored = _read(encode_entry(KEY, outputs, {"sequence": "a", "n": 3, "done": True}, KEYS))
    assert stored.parameters == {"sequence": "a", "n": 3, "done": True}
    assert list(stored) == list(outputs)
    for name, array in outputs.items():
        assert stored[name].dtype == array.dtype and stored[name].shape == array.shape
        assert stored[name].tolist() == array.tolist()
        assert not stored[name].flags.writeable  # every hit hands out the same bytes


def test_an_entry_reads_back_only_under_its_key_with_its_secret():
    value = encode_entry(KEY, mixed_outputs(), None, KEYS)
    with pytest.raises(ValueError, match="signature does not match"):
        _read(value, key=b"appliance:rc2:0100")  # copied under another request's key
    with pytest.raises(ValueError, match="signature does not match"):
        _read(value, keys=EntryKeys.of(b"another secret of thirty-two bytes"))
    with pytest.raises(ValueError, match="signature does not match"):
        _read(value, keys=EntryKeys.own())
    for at in (4, 40, len(value) // 2, len(value) - 1):  # any byte altered, in the tag or after it
        altered = bytearray(value)
        altered[at] ^= 1
        with pytest.raises(ValueError, match="signature does not match"):
            _read(bytes(altered))
    with pytest.raises(ValueError, match="signature does not match"):
        _read(value[:-1])  # cut short


def _signed(body: bytes, key: bytes = KEY, keys: EntryKeys = KEYS) -> bytes:
    """``body`` as an entry signed with ``keys``: what a writer holding the secret can make."""
    return b"ARC2" + keys.tag(key, body) + body


def _body(header: bytes, tail: bytes = b"") -> bytes:
    return len(header).to_bytes(4, "little") + header + tail


@pytest.mark.parametrize("body", [
    b"", b"\x00", b"\xff\xff\xff\x7f{}", _body(b"{}"), _body(b'{"o":[],"p":[]}'),
    _body(b'{"o":[["y","FP32",[4],16]],"p":{}}', b"\0" * 8),  # short of its bytes
    _body(b'{"o":[["y","FP32",[9],16]],"p":{}}', b"\0" * 16),  # shape and bytes disagree
    _body(b'{"o":[["y","NOPE",[4],16]],"p":{}}', b"\0" * 16),
    _body(b'{"o":[["y","FP32",[4]]],"p":{}}', b"\0" * 16),
    _body(b'{"o":[["t","BYTES",[1000000000],8]],"p":{}}', b"\0" * 8),  # a count no bytes hold
    _body(b'{"o":[],"p":{}}', b"junk"),
])
def test_a_signed_entry_that_does_not_read_back_exactly_is_refused(body):
    with pytest.raises(Exception):  # noqa: B017 - which error does not matter: each is a miss to the cache
        _read(_signed(body))


@pytest.mark.parametrize("value", [
    b"", b"ARC2", b"pickle\x80\x04",
    b'ARC1\x0f\x00\x00\x00{"o":[],"p":{}}',  # the unsigned format of earlier versions
    b'ARC1\x1f\x00\x00\x00{"o":[["y","FP32",[4],16]],"p":{}}' + b"\0" * 16,
])
def test_unsigned_and_old_entries_are_refused(value):
    with pytest.raises(ValueError, match="not a response cache entry of this version|signature"):
        _read(value)


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=256)
       | st.builds(lambda tail: _signed(encode_entry(KEY, mixed_outputs(), {}, KEYS)[36:80] + tail),
                   st.binary(max_size=64)))
def test_fuzzed_entries_never_read_back_as_something_unchecked(value):
    try:
        outputs = _read(value)
    except Exception:
        return
    for array in outputs.values():  # what does read back is exactly what the bytes say
        assert isinstance(array, np.ndarray) and not array.flags.writeable


def test_bytes_elements_are_reserved_before_they_are_made():
    value = encode_entry(KEY, {"t": np.array([b""] * 1000, dtype=object)}, None, KEYS)
    asked: list[int] = []
    decode_entry(open_entry(KEY, value, KEYS), asked.append)
    assert asked and asked[0] >= 1000 * 41  # a pointer and a bytes object per element, before any is made

    def refuse(size: int) -> None:
        raise MemoryError("over the budget")

    with pytest.raises(MemoryError):
        decode_entry(open_entry(KEY, value, KEYS), refuse)


FORMS = OutputForms("m", {"y": ("FP32", (4,)), "t": ("BYTES", (-1,)), "r": ("INT8", (2, -1))}, batched=True)


@pytest.mark.parametrize(("outputs", "batch", "words"), [
    ({"y": np.zeros((2, 4), np.float32)}, 2, None),
    ({"y": np.zeros((2, 4), np.float32), "t": np.array([[b"a"], [b"b"]], object)}, 2, None),
    ({"r": np.zeros((1, 2, 9), np.int8)}, 1, None),  # -1: any size
    ({"y": np.array([[b"pwned!"] * 4], object)}, 1, "is BYTES; its config declares FP32"),
    ({"y": np.zeros((1, 4), np.float64)}, 1, "is FP64; its config declares FP32"),
    ({"y": np.zeros((3, 4), np.float32)}, 2, "batch size 2 needs that many rows"),
    ({"y": np.zeros((2, 5), np.float32)}, 2, "declares dims \\[4\\]"),
    ({"y": np.zeros((2, 4, 1), np.float32)}, 2, "declares dims"),
    ({"r": np.zeros((1, 3, 9), np.int8)}, 1, "declares dims \\[2, -1\\]"),
    ({"y": np.float32(1.0)}, 1, "rows"),
    ({"other": np.zeros((1, 4), np.float32)}, 1, "not in model 'm'"),
])
def test_a_response_must_be_the_models_outputs(outputs, batch, words):
    problem = FORMS.mismatch(outputs, batch)
    if words is None:
        assert problem is None
    else:
        assert problem is not None
        assert re.search(words, problem), problem


def test_an_unbatched_model_takes_its_dims_whole():
    forms = OutputForms("m", {"y": ("FP32", (2, 2))}, batched=False)
    assert forms.mismatch({"y": np.zeros((2, 2), np.float32)}, 1) is None
    assert forms.mismatch({"y": np.zeros((1, 2, 2), np.float32)}, 1) is not None


def test_a_configured_secret_is_shared(tmp_path):
    first = entry_keys(SECRET, None, tmp_path / "a", None)
    second = entry_keys(f"  {SECRET}\n", None, tmp_path / "b", None)
    assert first == second and first.shared
    assert first.names != first.mac  # one secret, a key for each use
    assert not (tmp_path / "a").exists()  # nothing written where the operator gave the key


def test_a_key_file_is_read_and_must_be_private(tmp_path):
    path = tmp_path / "redis.key"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    assert entry_keys(None, path, tmp_path, None) == entry_keys(SECRET, None, tmp_path, None)
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="can be read by other users.*chmod 600"):
        entry_keys(None, path, tmp_path, None)
    path.write_text("short\n")
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="at least 32"):
        entry_keys(None, path, tmp_path, None)
    with pytest.raises(ConfigError, match="No such file"):
        entry_keys(None, tmp_path / "missing", tmp_path, None)


def test_without_a_secret_a_box_keeps_its_own_in_the_state_dir(tmp_path):
    keys = entry_keys(None, None, tmp_path, None)
    path = tmp_path / "response-cache-key"
    assert not keys.shared
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert entry_keys(None, None, tmp_path, None) == keys  # a restart reads its own entries back
    assert entry_keys(None, None, tmp_path / "other box", None) != keys


def test_a_state_dir_that_cannot_be_written_signs_with_a_key_in_memory(tmp_path):
    (tmp_path / "a file").write_text("")
    where = tmp_path / "a file" / "state"  # not a directory, even for root
    state = StateDir(where, writable=False, reason="not a directory")
    first, second = entry_keys(None, None, where, state.note), entry_keys(None, None, where, state.note)
    assert first != second and not first.shared
    assert [problem.kind for problem in state.problems] == ["response_cache_key_not_saved"]
    with pytest.raises(ConfigError, match="cannot be read or saved"):
        entry_keys(None, None, where, None)


def test_the_secret_settings(tmp_path):
    section = load_settings({}, {"APPLIANCE_CACHE_REDIS_KEY": SECRET, "APPLIANCE_STATE_DIR": str(tmp_path)})
    assert section.response_cache.redis_key == SECRET
    assert SECRET not in repr(section)
    with pytest.raises(ConfigError, match="cache_redis_key must be at least 32"):
        load_settings({}, {"APPLIANCE_CACHE_REDIS_KEY": "short", "APPLIANCE_STATE_DIR": str(tmp_path)})
    with pytest.raises(ConfigError, match="give one of them"):
        load_settings({}, {"APPLIANCE_CACHE_REDIS_KEY": SECRET, "APPLIANCE_CACHE_REDIS_KEY_FILE": "/k",
                           "APPLIANCE_STATE_DIR": str(tmp_path)})
    from_file = load_settings({}, {"APPLIANCE_CACHE_REDIS_KEY_FILE": "/etc/appliance/redis.key",
                                   "APPLIANCE_STATE_DIR": str(tmp_path)})
    assert str(from_file.response_cache.redis_key_file) == "/etc/appliance/redis.key"
