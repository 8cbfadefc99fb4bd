"""``python -m hardware_probe [TIMEOUT]``: the probe report as JSON on stdout (used to probe in a
separate process, so that the caller never imports the runtimes the probe looks at)."""

import json
import sys

from hardware_probe.probe import DEFAULT_TIMEOUT, probe

print(json.dumps(probe(timeout=float(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_TIMEOUT).to_json(), default=str))
