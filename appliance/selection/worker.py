"""Measure a model's candidate plans in a child process (``python -m appliance.selection.worker``).

The daemon sends one JSON job on stdin and reads the outcome from stdout; the decision and artefacts
land in the shared model cache (under its file lock), where the daemon then finds them. Building every
candidate runtime here keeps the daemon's memory to the runtime it serves with, and a candidate that
crashes takes down this process, not the daemon.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.backends import LoadContext, RuntimeOptions, named
from appliance.errors import ApplianceError

__all__ = ["job_for", "main"]


def job_for(selector: Any, info: Any, context: LoadContext) -> dict[str, Any]:
    """The JSON job describing one tuning run."""
    return {
        "backend": info.name,
        "model_name": context.model_name,
        "version": context.version,
        "model_file": str(context.model_file),
        "config": json_format.MessageToDict(context.config, preserving_proto_field_name=True),
        "options": dataclasses.asdict(context.options),
        "threads": context.threads,
        **selector.job_fields(),
    }


def _run(job: dict[str, Any]) -> dict[str, Any]:
    from appliance.selection.selector import SelectionSettings, Selector, TuneRequest
    from hardware_probe import ProbeReport
    from model_cache import ModelCache

    report = ProbeReport(sections=job["probe"])
    selector = Selector(report, job["fingerprint"], job["runtime_versions"],
                        ModelCache(Path(job["cache_dir"]), job["cache_max_bytes"],
                                   writable=job.get("cache_writable", True)),
                        SelectionSettings(**job["settings"]), cpu_flags=tuple(job["cpu_flags"]))
    info = named(job["backend"])
    config = json_format.ParseDict(job["config"], mc.ModelConfig())
    context = LoadContext(job["model_name"], job["version"], Path(job["model_file"]), config,
                          RuntimeOptions(**{**job["options"],
                                            "onnx_providers": tuple(job["options"]["onnx_providers"])}),
                          threads=job["threads"])
    os.nice(job.get("nice", 0))
    choice = selector.choose(info, context, force=True, key=job.get("key"), request=TuneRequest(**job["request"]))
    # The decision travels back too: when the cache could not store it, the daemon serves it from here.
    return {"ok": True, "chosen": choice.plan.id, "decision": choice.decision}


def main() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        outcome = _run(json.loads(sys.stdin.read()))
    except ApplianceError as exc:
        outcome = {"ok": False, "error": exc.message}
    except Exception as exc:  # reported to the daemon as the model's load failure
        outcome = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(outcome, default=str))


if __name__ == "__main__":
    main()
