"""The single models of the Python backend tests (files under tests/models/simple/), as text for the tests
that still write them with ``write_python_model``; new tests put them into a repository with
``copy_model(repo, "simple/<name>")``."""

from tests.models import MODELS

_SIMPLE = MODELS / "simple"

ADD_SUB = (_SIMPLE / "add_sub" / "model.py").read_text()
ADD_SUB_CONFIG = (_SIMPLE / "add_sub" / "config.pbtxt").read_text()
NUMPY_CNN = (_SIMPLE / "numpy_cnn" / "model.py").read_text()
"""Its tensors come from auto_complete_config(), so it needs no config.pbtxt."""
SIMPLE_CONFIG = (_SIMPLE / "sleepy" / "config.pbtxt").read_text()
"""x -> y, two FP32 values: the config of raises, wrong_count, exits, request_error and sleepy."""
RAISES = (_SIMPLE / "raises" / "model.py").read_text()
WRONG_COUNT = (_SIMPLE / "wrong_count" / "model.py").read_text()
EXITS = (_SIMPLE / "exits" / "model.py").read_text()
REQUEST_ERROR = (_SIMPLE / "request_error" / "model.py").read_text()
SLEEPY = (_SIMPLE / "sleepy" / "model.py").read_text()
"""Sleeps x[0] seconds, then echoes x (serve it with SIMPLE_CONFIG): a request that takes as long as asked."""
