"""Property tests of what a client's shared-memory register request carries (name, key, offset, size, over
HTTP JSON or gRPC): any values are refused with a 4xx in Triton's words or registered, and a message
quotes a key escaped and cut (appliance.protocol.shared_memory.system.shown), never raw."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.core.errors import ApplianceError
from appliance.protocol.shared_memory.system import shown
from tests.appliance.protocol.shared_memory.test_system import registry
from tests.appliance.strategies_fuzz import assert_client_error

FUZZ = settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

_TRITONS_WORDS = ("Unable to open shared memory region: ", "Invalid shared memory region: ",
                  "cannot register shared memory region ", "failed to register shared memory region ")

keys = st.one_of(st.text(max_size=400), st.text(alphabet="/.-_ab", max_size=12),
                 st.sampled_from(["/", "//", "/..", "/triton_python_backend_shm_region_1", "/appliance-x", "/sem.x"]),
                 st.integers(), st.none(), st.binary(max_size=20))
integers = st.one_of(st.integers(min_value=-(1 << 70), max_value=1 << 70), st.floats(), st.text(max_size=5),
                     st.booleans(), st.none())


@FUZZ
@given(text=st.text(max_size=500), width=st.integers(min_value=1, max_value=100))
def test_a_quoted_key_is_printable_and_bounded(text, width):
    quoted = shown(text, width)
    assert quoted.isprintable() and len(quoted) <= width + 3
    if text.isprintable() and len(text) <= width:
        assert quoted == text


@FUZZ
@given(name=st.one_of(st.text(max_size=80), st.none(), st.integers()), key=keys, offset=integers, size=integers)
def test_any_register_request_is_refused_in_tritons_words_or_registered(name, key, offset, size):
    shm = registry()
    try:
        shm.system.register(name, key, offset, size, local=True)  # type: ignore[arg-type]
    except ApplianceError as exc:
        assert_client_error(exc)
        assert exc.message.startswith(_TRITONS_WORDS), exc.message
        assert exc.message.isprintable()
        if isinstance(key, str) and not key.isprintable():
            assert key not in exc.message  # quoted escaped, never raw
    else:
        shm.system.unregister(name, local=True)
    finally:
        shm.close()
    assert shm.counts() == (0, 0)
