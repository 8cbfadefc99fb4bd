"""Python models that reschedule their requests (``request.set_release_flags(RESCHEDULE)``), as Triton's
iterative-sequence users write them, kept as files under tests/models/iterative/: a token-by-token
generator, a model that answers on its second try (config.pbtxt; dynamic.pbtxt and sequence.pbtxt put it
under schedulers that cannot run a request again), one that returns a response for a request it
rescheduled, and a BLS driver calling the first two. Read as text here for ``write_python_model``."""

from tests.models import MODELS

_ITERATIVE = MODELS / "iterative"

TOKENS = (_ITERATIVE / "tokens" / "model.py").read_text()
TOKENS_CONFIG = (_ITERATIVE / "tokens" / "config.pbtxt").read_text()
SECOND_TRY = (_ITERATIVE / "second_try" / "model.py").read_text()
SECOND_TRY_CONFIG = (_ITERATIVE / "second_try" / "config.pbtxt").read_text()
SECOND_TRY_DYNAMIC = (_ITERATIVE / "second_try" / "dynamic.pbtxt").read_text()
SECOND_TRY_SEQUENCE = (_ITERATIVE / "second_try" / "sequence.pbtxt").read_text()
WRONG_RETURN = (_ITERATIVE / "wrong_return" / "model.py").read_text()
WRONG_RETURN_CONFIG = (_ITERATIVE / "wrong_return" / "config.pbtxt").read_text()
BLS_DRIVER = (_ITERATIVE / "bls_driver" / "model.py").read_text()
BLS_DRIVER_CONFIG = (_ITERATIVE / "bls_driver" / "config.pbtxt").read_text()
