"""The lean reference's model process: runs a Triton Python-backend ``model.py`` (``TritonPythonModel``
with ``initialize``/``execute``/``finalize``) through bench.lean_pb_utils, fed over a pair of pipes.

    python -m bench.lean_model MODEL_FILE CONFIG_JSON READ_FD WRITE_FD   (started by bench.lean_reference)

Both ways a message is a frame: a 4-byte little-endian length, then a pickle. The server sends lists of
``(id, {input name: array})``; each read drains what the pipe holds, every request in it runs through
``execute`` alone (Triton's default scheduler: one request per call), and all their answers go back in
one frame, a list of ``(id, ok, outputs or error text)``, outputs as ``[(name, array), ...]``. The first
frame out is ``"ready"``, once ``initialize`` returned. Imports nothing of the server.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any

from bench import lean_pb_utils

__all__ = ["frame", "main", "split_frames"]

_HEADER = 4
_READ_BYTES = 1 << 16


def frame(message: object) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return len(data).to_bytes(_HEADER, "little") + data


def split_frames(buffer: bytearray) -> list[Any]:
    """The messages of every whole frame at the start of ``buffer``, which loses them."""
    messages, start = [], 0
    while len(buffer) - start >= _HEADER:
        end = start + _HEADER + int.from_bytes(buffer[start:start + _HEADER], "little")
        if len(buffer) < end:
            break
        messages.append(pickle.loads(buffer[start + _HEADER:end]))
        start = end
    del buffer[:start]
    return messages


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _load(model_file: Path, config: dict[str, Any]) -> Any:
    sys.modules["triton_python_backend_utils"] = lean_pb_utils
    spec = importlib.util.spec_from_file_location("lean_model_under_test", model_file)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {model_file}: expected a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    if hasattr(model, "initialize"):
        model.initialize({"model_config": json.dumps(config), "model_instance_kind": "CPU",
                          "model_instance_name": f"{config.get('name', 'model')}_0",
                          "model_instance_device_id": "0", "model_repository": str(model_file.parent.parent),
                          "model_version": model_file.parent.name, "model_name": config.get("name", "")})
    return model


def _execute(model: Any, ident: int, inputs: dict[str, Any]) -> tuple[int, bool, Any]:
    try:
        request = lean_pb_utils.InferenceRequest([lean_pb_utils.Tensor(n, a) for n, a in inputs.items()])
        responses = model.execute([request])
        if not responses or len(responses) != 1:
            return ident, False, f"execute() returned {0 if not responses else len(responses)} responses for 1 request"
        response = responses[0]
        error = response.error()
        if error is not None:
            return ident, False, error.message()
        return ident, True, [(t.name(), t.as_numpy()) for t in response.output_tensors()]
    except Exception as exc:  # the model's failure is this request's answer, not the process's end
        return ident, False, f"{type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_file", type=Path)
    parser.add_argument("config_json")
    parser.add_argument("read_fd", type=int)
    parser.add_argument("write_fd", type=int)
    args = parser.parse_args(argv)
    model = _load(args.model_file, json.loads(args.config_json))
    _write_all(args.write_fd, frame("ready"))
    buffer = bytearray()
    while chunk := os.read(args.read_fd, _READ_BYTES):
        buffer += chunk
        answers = [_execute(model, ident, inputs)
                   for batch in split_frames(buffer) for ident, inputs in batch]
        if answers:
            _write_all(args.write_fd, frame(answers))
    if hasattr(model, "finalize"):
        model.finalize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
