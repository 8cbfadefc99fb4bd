"""What a model process loads before its model: every Python model instance is one, so a module it loads
for nothing costs its memory once per instance (the idle-memory target against Triton)."""

from __future__ import annotations

import json
import subprocess
import sys

_DAEMON_ONLY = ("model_cache", "tarfile", "zipfile", "lzma", "bz2", "aiohttp", "onnxruntime", "torch", "redis")


def test_a_model_process_loads_none_of_the_daemons_archives_caches_or_front_ends():
    script = ("import json, sys\nimport appliance.backends.python.model_process.stub\n"
              f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {_DAEMON_ONLY!r})))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                       timeout=60).stdout)
    assert loaded == []
