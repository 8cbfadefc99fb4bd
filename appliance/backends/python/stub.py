"""The model process: loads a Triton model.py and serves execute() calls from the daemon.

Run by the daemon as ``python -m appliance.backends.python.stub FD MODEL_FILE``, with FD one end of a
socket pair. Messages are small pickled tuples; tensors travel through shared-memory arenas.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from appliance.backends.python import triton_python_backend_utils as pb_utils
from appliance.backends.python.arena import Arena

log = logging.getLogger("appliance.python-stub")


def _load_model_class(model_file: Path) -> type:
    # model.py files import the utilities as a top-level module, as under Triton.
    sys.modules["triton_python_backend_utils"] = pb_utils
    sys.path.insert(0, str(model_file.parent))
    spec = importlib.util.spec_from_file_location(f"appliance_model_{abs(hash(model_file))}", model_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model_class = getattr(module, "TritonPythonModel", None)
    if model_class is None:
        raise AttributeError(f"{model_file} defines no class TritonPythonModel")
    return model_class


def _auto_complete(model_class: type, config: dict) -> dict:
    hook = getattr(model_class, "auto_complete_config", None)
    if hook is None:
        return config
    result = hook(pb_utils.ModelConfig(config))
    return result.as_dict() if isinstance(result, pb_utils.ModelConfig) else config


class _Attached:
    """The daemon's input arena, re-attached whenever the daemon replaces it."""

    def __init__(self) -> None:
        self.arena: Arena | None = None

    def get(self, info: dict) -> Arena:
        if self.arena is None or self.arena.path != info["path"]:
            if self.arena is not None:
                self.arena.close()
            self.arena = Arena.attach(info["path"], info["size"])
        return self.arena


def _requests(arena: Arena, batch: list[dict]) -> list[pb_utils.InferenceRequest]:
    return [
        pb_utils.InferenceRequest(
            inputs=[pb_utils.Tensor(d[0], arena.read(d, copy=False)) for d in item["inputs"]],
            requested_output_names=item["outputs"],
            request_id=item.get("id") or "",
            parameters=item.get("parameters") or {},
        )
        for item in batch
    ]


def _pack_responses(responses: list, arena: Arena | None) -> tuple[list[Any], Arena]:
    """Write every response's tensors into the output arena (growing it); errors stay as messages."""
    tensors = [
        [(t.name(), t.as_numpy()) for t in r.output_tensors()] if not r.has_error() else [] for r in responses
    ]
    needed = sum(Arena.needed(ts) for ts in tensors)
    if arena is None or arena.size < needed:
        if arena is not None:
            arena.close()
        arena = Arena.create(needed * 2)
    packed: list[Any] = []
    offset = 0
    for response, response_tensors in zip(responses, tensors):
        if response.has_error():
            error = response.error()
            packed.append(("error", error.message(), error.code()))
            continue
        descriptors, offset = arena.write(response_tensors, offset)
        packed.append(("ok", descriptors))
    return packed, arena


def serve(conn: Connection, model_file: Path) -> None:
    model_class = _load_model_class(model_file)
    command, config = conn.recv()
    assert command == "describe"
    conn.send(("described", _auto_complete(model_class, config)))
    command, args = conn.recv()
    assert command == "initialize"
    model = model_class()
    if hasattr(model, "initialize"):
        model.initialize(args)
    conn.send(("ready", None))
    inputs, outputs = _Attached(), None
    while True:
        message = conn.recv()
        if message[0] == "finalize":
            break
        _, arena_info, batch = message
        requests = _requests(inputs.get(arena_info), batch)
        try:
            responses = model.execute(requests)
        except Exception as exc:
            conn.send(("failed", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
            continue
        if not isinstance(responses, list) or len(responses) != len(requests):
            count = len(responses) if isinstance(responses, list) else type(responses).__name__
            conn.send(("failed", f"execute() returned {count} responses for {len(requests)} requests; "
                                 "it must return a list with one InferenceResponse per request", ""))
            continue
        packed, outputs = _pack_responses(responses, outputs)
        conn.send(("done", outputs.info(), packed))
    if hasattr(model, "finalize"):
        model.finalize()
    if outputs is not None:
        outputs.close()
    conn.send(("finalized", None))


def main() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    conn = Connection(int(sys.argv[1]))
    try:
        serve(conn, Path(sys.argv[2]))
    except EOFError:
        pass  # the daemon went away
    except Exception as exc:
        try:
            conn.send(("crashed", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        except OSError:
            pass
        raise SystemExit(1) from exc


if __name__ == "__main__":
    main()
