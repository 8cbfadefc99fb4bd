"""Measure a model's candidate plans in a child process (``python -m appliance.selection.worker``).

The daemon sends one JSON job (appliance.selection.job.TuningJob) on stdin and reads the outcome from
stdout; the decision and artefacts land in the shared model cache (under its file lock), where the daemon
then finds them. Building every candidate runtime here keeps the daemon's memory to the runtime it serves
with, and a candidate that crashes takes down this process, not the daemon.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

from appliance.backends import named
from appliance.core.errors import ApplianceError
from appliance.selection.job import TuningJob
from appliance.selection.selector import Selector
from model_cache import ModelCache

__all__ = ["main", "run"]


def run(job: TuningJob) -> dict[str, Any]:
    """Measure and store the decision; the outcome the daemon reads."""
    cache = ModelCache(job.cache_dir, job.cache_max_bytes, writable=job.cache_writable)
    selector = Selector(job.hardware, cache, job.settings)
    os.nice(job.nice)
    choice = selector.choose(named(job.backend), job.context, force=True, key=job.key, request=job.request)
    # The decision travels back too: when the cache could not store it, the daemon serves it from here.
    return {"ok": True, "chosen": choice.plan.id, "decision": choice.decision}


def main() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        outcome = run(TuningJob.from_json(sys.stdin.read()))
    except ApplianceError as exc:
        outcome = {"ok": False, "error": exc.message}
    except Exception as exc:  # reported to the daemon as the model's load failure
        outcome = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(outcome, default=str))


if __name__ == "__main__":
    main()
