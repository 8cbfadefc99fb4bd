"""``appliance push MODEL_DIR``: load a Triton model directory on boxes, over Triton's load API.

The directory's config.pbtxt goes as the ``config`` parameter (JSON), every other file as a
``file:<path>`` parameter (base64), as Triton's load API takes file overrides. Boxes are loaded in
parallel, with one progress line each; the exit status is 1 when any box failed (each named, with why).

Only to trusted boxes (see targets.py): a box found on the LAN that the operator did not pin is refused
before anything is sent to it, with the command that pins it; a box named by URL (by any name of its
address) must prove it is the box pinned there, or the pinned box it says it is, before the push goes.
The token is never sent: the push is signed for the pinned box id, over a nonce that box issued
(appliance.security.fleet_signature).
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from google.protobuf import json_format

from appliance.client.trust import TrustStore
from appliance.commands.targets import (
    BoxClient,
    Refusal,
    Target,
    add_target_options,
    choose_targets,
    prove_identity,
)
from appliance.core.errors import ConfigError
from appliance.repository.config import CONFIG_FILENAME, read_config
from appliance.settings import Settings

__all__ = ["add_parser", "model_parameters", "run"]

_SKIPPED = ("__pycache__",)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("push", help="load a Triton model directory on boxes of the LAN (Triton's load API)")
    parser.add_argument("model_dir", type=Path, metavar="MODEL_DIR",
                        help="a model directory: config.pbtxt (optional) and version directories (1/model.onnx)")
    add_target_options(parser, choose=True)
    parser.add_argument("--token-file", type=Path,
                        help="file holding the boxes' control token, used to sign the push and never sent "
                             "(default: APPLIANCE_AUTH_TOKEN; none is needed from an address the box exempts, "
                             "such as its own host)")
    parser.add_argument("--name", dest="model_name", help="the model's name on the boxes (default: the directory's)")
    parser.add_argument("--load-timeout", type=float, default=600.0,
                        help="seconds a box may take to load the model (default 600)")


def _files(model_dir: Path) -> dict[str, bytes]:
    root = model_dir.resolve()
    files: dict[str, bytes] = {}
    for path in sorted(model_dir.rglob("*")):
        relative = path.relative_to(model_dir)
        if any(part.startswith(".") or part in _SKIPPED for part in relative.parts) or path.is_dir():
            continue
        if relative.as_posix() == CONFIG_FILENAME:
            continue
        if not path.resolve().is_relative_to(root):
            raise ConfigError(f"{path} points outside {model_dir}; copy the file into the model directory")
        if not path.is_file():
            continue
        files[relative.as_posix()] = path.read_bytes()
    if not any("/" in name and name.split("/")[0].isdigit() for name in files):
        raise ConfigError(f"{model_dir} has no version directory with files; expected {model_dir.name}/1/<model "
                          f"file> (e.g. {model_dir.name}/1/model.onnx)")
    return files


def model_parameters(model_dir: Path, name: str) -> tuple[dict[str, str], int]:
    """The load request's parameters for ``model_dir`` (config as JSON, files as base64), and the bytes
    of the files."""
    if not model_dir.is_dir():
        raise ConfigError(f"{model_dir} is not a directory; give a Triton model directory such as models/mlp")
    config = read_config(model_dir)
    config.name = name
    files = _files(model_dir)
    parameters = {"config": json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True))}
    parameters.update({f"file:{relative}": base64.b64encode(data).decode() for relative, data in files.items()})
    return parameters, sum(len(data) for data in files.values())


def _push(target: Target, name: str, body: bytes, token: str | None, store: TrustStore, timeout: float) -> str:
    """'' when the box loaded the model, else why not."""
    if not target.trust.trusted:
        return f"not pushed: {target.trust.reason}"
    box = target.reachable_box
    path = f"/v2/repository/models/{quote(name, safe='')}/load"
    with BoxClient(box, fingerprint=target.fingerprint, again=target.again) as client:
        try:
            identity = prove_identity(client, target, store)
            if token and identity is not None:
                status, answer = client.signed(token, *identity, "POST", path, body, timeout)
            else:
                status, answer = client.call("POST", path, body, timeout=timeout)
        except Refusal as exc:
            return f"not pushed: {exc}"
        except OSError as exc:
            return f"cannot reach {box.base_url}: {exc}"
    if status == 200:
        return ""
    error = answer.get("error") if isinstance(answer, dict) else answer
    if status == 401 and token is None:
        hint = " (give the boxes' token: --token-file F; it signs the push and is never sent)"
    elif status == 401 and identity is None:
        hint = (" (the box takes no signed requests: Triton or an older appliance; this command never sends the "
                "token itself)")
    elif status == 401:
        hint = " (the box's token is not the one in --token-file or APPLIANCE_AUTH_TOKEN)"
    else:
        hint = {403: " (this client may not load models on the box)"}.get(status, "")
    return f"HTTP {status}: {error}{hint}"


def run(args: argparse.Namespace, settings: Settings) -> int:
    name = args.model_name or args.model_dir.resolve().name
    parameters, size = model_parameters(args.model_dir, name)
    chosen, store, token = choose_targets(args, settings, choose=True)
    body = json.dumps({"parameters": parameters}).encode()
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            print(line, flush=True)

    def one(target: Target) -> str:
        box = target.box
        if not target.trust.trusted:
            problem = f"not pushed: {target.trust.reason}"
            say(f"{box.name}: {problem}")
            return problem
        amount = f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.1f} kB"
        say(f"{box.name}: pushing {name} ({amount}) to {target.reachable_box.base_url}")
        started = time.monotonic()
        problem = _push(target, name, body, token, store, args.load_timeout)
        took = time.monotonic() - started
        say(f"{box.name}: FAILED after {took:.1f} s: {problem}" if problem else
            f"{box.name}: {name} loaded in {took:.1f} s")
        return problem

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(chosen))) as pool:
        problems = dict(zip((t.box.name for t in chosen), pool.map(one, chosen)))
    failed = {box: problem for box, problem in problems.items() if problem}
    if failed:
        print(f"appliance push: {name} failed on {len(failed)} of {len(chosen)} box(es): "
              + "; ".join(f"{box}: {problem}" for box, problem in failed.items()), file=sys.stderr)
        return 1
    print(f"{name} loaded on {len(chosen)} box(es)")
    return 0
