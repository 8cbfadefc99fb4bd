"""The models of Triton's qa/L0_decoupled repository, written here (nothing of NVIDIA's is copied): a
decoupled Python ``repeat_int32`` with the qa's tensors (IN, DELAY, WAIT -> OUT, IDX), which is
tests/models/decoupled/repeat served with its repeat_int32.pbtxt, and an ``identity_int32`` on the
identity backend (a config alone: an empty version directory beside it is the whole model), which the
qa's ``sequence_repeat`` ensemble chains."""

from __future__ import annotations

from tests.models import MODELS

_QA = MODELS / "qa_decoupled"

REPEAT_INT32 = (MODELS / "decoupled" / "repeat" / "model.py").read_text()
REPEAT_INT32_CONFIG = (MODELS / "decoupled" / "repeat" / "repeat_int32.pbtxt").read_text()
IDENTITY_INT32_CONFIG = (_QA / "identity_int32" / "config.pbtxt").read_text()
