"""The models of the Python backend's pipeline tests (models calling models, the pb_utils surface, error
codes), as files under tests/models/pipelines/, read as text for the tests that write them with
``write_python_model``; ``bls_decoupled`` calls tests/models/decoupled/repeat. ``identity_fp32`` is the
config of the ONNX identity the BLS models call."""

from tests.models import MODELS

_PIPELINES = MODELS / "pipelines"

IDENTITY_CONFIG = (_PIPELINES / "identity_fp32" / "config.pbtxt").read_text()
BLS_IO = (_PIPELINES / "bls_sync" / "config.pbtxt").read_text()
"""The config of bls_sync and bls_async."""
BLS_SYNC = (_PIPELINES / "bls_sync" / "model.py").read_text()
BLS_ASYNC = (_PIPELINES / "bls_async" / "model.py").read_text()
BLS_DECOUPLED = (_PIPELINES / "bls_decoupled" / "model.py").read_text()
BLS_DECOUPLED_CONFIG = (_PIPELINES / "bls_decoupled" / "config.pbtxt").read_text()
SURFACE = (_PIPELINES / "surface" / "model.py").read_text()
SURFACE_CONFIG = (_PIPELINES / "surface" / "config.pbtxt").read_text()
ERRORS = (_PIPELINES / "errors" / "model.py").read_text()
ERRORS_CONFIG = (_PIPELINES / "errors" / "config.pbtxt").read_text()
DRIVER = (_PIPELINES / "driver" / "model.py").read_text()
DRIVER_CONFIG = (_PIPELINES / "driver" / "config.pbtxt").read_text()
