"""The lean reference: the smallest honest Python server for the appliance's commonest job, a yardstick
for what each layer of its request path may cost (issue 49; bench.lean measures the two side by side).

    python -m bench.lean_reference --port P --model-dir DIR [--host 127.0.0.1] [--token TOKEN]

One model (DIR: a Triton model directory, config.pbtxt and <version>/model.py of the Python backend),
served over HTTP/1.1: ``POST /v2/models/<name>[/versions/<n>]/infer`` with KServe v2 JSON and ``GET
/v2/health/ready`` (and ``/live``). httptools' parser on uvloop, one callback per request and no task or
future: the body is parsed with orjson into numpy arrays checked against the config (name, datatype,
shape against the data's length, the batch bound), sent to one model process (bench.lean_model: pipes
and pickle, the sends of one loop turn coalesced into one write), and its answer written as v2 JSON
(orjson; non-finite values as Triton writes them). Bad JSON or inputs get 400 ``{"error": ...}``, an
unknown model or route 404, a body over 64 KiB 413, a head over 32 KiB 431, a malformed request 400 and
the connection closed; with ``--token`` every request but health needs ``Authorization: Bearer TOKEN``
(401). Answers on a connection go out in request order. Prints ``lean reference serving <model> on
http://HOST:PORT`` once the model process is ready; stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hmac
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from email.utils import formatdate
from pathlib import Path
from typing import Any

import httptools
import numpy as np
import orjson
import uvloop
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from bench.lean_model import frame, split_frames

__all__ = ["BadRequest", "Model", "decode", "encode", "main", "read_model"]

MAX_BODY = 64 * 1024
MAX_HEAD = 32 * 1024
_PIPELINED = 8
"""Requests a connection may have waiting for answers before reading from it pauses."""
_ROOT = Path(__file__).resolve().parent.parent
_INFER = re.compile(rb"/v2/models/([A-Za-z0-9_.-]+)(?:/versions/(\d+))?/infer")
_DTYPES = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
           "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
           "FP32": np.float32, "FP64": np.float64}
_NAMES = {np.dtype(t): name for name, t in _DTYPES.items()}
_ACCEPTS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}
"""numpy kinds of parsed JSON values each kind of tensor takes (no 1.5 for INT32, no 1 for BOOL)."""
_REASONS = {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 404: b"Not Found", 413: b"Payload Too Large",
            431: b"Request Header Fields Too Large", 500: b"Internal Server Error", 503: b"Service Unavailable"}
Respond = Callable[[int, bytes], None]


class BadRequest(Exception):
    status = 400


@dataclasses.dataclass(frozen=True)
class _Spec:
    datatype: str
    dtype: np.dtype
    dims: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    version: str
    max_batch_size: int
    inputs: dict[str, _Spec]
    outputs: dict[str, _Spec]
    file: Path
    config: dict[str, Any]


def read_model(directory: Path) -> Model:
    """The model in ``directory`` (config.pbtxt, the highest numbered version's model.py)."""
    config = text_format.Parse((directory / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    versions = sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and (p / "model.py").is_file())
    if not versions:
        raise SystemExit(f"{directory} has no version with a model.py; expected {directory}/1/model.py")

    def spec(tensor: Any) -> _Spec:
        datatype = model_config_pb2.DataType.Name(tensor.data_type).removeprefix("TYPE_")
        if datatype not in _DTYPES:
            raise SystemExit(f"the lean reference serves numeric tensors only, not {datatype} ({tensor.name})")
        return _Spec(datatype, np.dtype(_DTYPES[datatype]), tuple(tensor.dims))

    return Model(config.name or directory.name, str(versions[-1]), config.max_batch_size,
                 {t.name: spec(t) for t in config.input}, {t.name: spec(t) for t in config.output},
                 directory / str(versions[-1]) / "model.py",
                 json_format.MessageToDict(config, preserving_proto_field_name=True) | {"name": directory.name})


def _check_shape(model: Model, name: str, spec: _Spec, shape: Any) -> tuple[int, ...]:
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise BadRequest(f"input '{name}': 'shape' must be a list of non-negative integers")
    dims = shape
    if model.max_batch_size:
        if not shape or not 1 <= shape[0] <= model.max_batch_size:
            raise BadRequest(f"input '{name}': the batch size (first dimension) must lie in 1..{model.max_batch_size}")
        dims = shape[1:]
    if len(dims) != len(spec.dims) or any(want not in (-1, got) for want, got in zip(spec.dims, dims)):
        raise BadRequest(f"input '{name}': shape {shape} does not match the model's {list(spec.dims)}"
                         + (" after the batch dimension" if model.max_batch_size else ""))
    return tuple(shape)


def _decode_input(model: Model, item: Any) -> tuple[str, np.ndarray]:
    name = item.get("name") if isinstance(item, dict) else None
    if not isinstance(name, str) or name not in model.inputs:
        raise BadRequest(f"unknown input {name!r}: model '{model.name}' takes {sorted(model.inputs)}")
    spec = model.inputs[name]
    if item.get("datatype") != spec.datatype:
        raise BadRequest(f"input '{name}': datatype {item.get('datatype')!r}, the model takes {spec.datatype}")
    shape = _check_shape(model, name, spec, item.get("shape"))
    if "data" not in item:
        raise BadRequest(f"input '{name}': no 'data' (the lean reference takes JSON data only)")
    try:
        source = np.array(item["data"])
    except (ValueError, TypeError, OverflowError) as exc:
        raise BadRequest(f"input '{name}': 'data' does not hold {spec.datatype} values ({exc})") from None
    if source.size != math.prod(shape):
        raise BadRequest(f"input '{name}': shape {list(shape)} needs {math.prod(shape)} elements, "
                         f"'data' has {source.size}")
    if source.size and source.dtype.kind not in _ACCEPTS[spec.dtype.kind]:
        raise BadRequest(f"input '{name}': 'data' does not hold {spec.datatype} values")
    with np.errstate(over="ignore"):
        array = source.astype(spec.dtype).reshape(shape)
    if spec.dtype.kind in "iu" and not np.array_equal(array, source.reshape(shape)):
        raise BadRequest(f"input '{name}': a value is out of {spec.datatype}'s range")
    if spec.dtype.kind == "f" and source.dtype != spec.dtype and not np.isfinite(array).all():
        raise BadRequest(f"input '{name}': a value is beyond {spec.datatype}'s range")
    return name, array


def decode(model: Model, body: bytes) -> tuple[dict[str, np.ndarray], str | None, set[str] | None]:
    """A v2 JSON infer request's inputs, id and the outputs it asks for (None: all), checked."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("inputs"), list):
        raise BadRequest("expected a JSON object with an 'inputs' list (KServe v2 inference request)")
    ident = document.get("id")
    if ident is not None and not isinstance(ident, str):
        raise BadRequest("'id' must be a string")
    arrays: dict[str, np.ndarray] = {}
    for item in document["inputs"]:
        name, array = _decode_input(model, item)
        if name in arrays:
            raise BadRequest(f"input '{name}' is given twice")
        arrays[name] = array
    if arrays.keys() != model.inputs.keys():
        raise BadRequest(f"missing inputs {sorted(model.inputs.keys() - arrays.keys())}")
    if model.max_batch_size and len({a.shape[0] for a in arrays.values()}) > 1:
        raise BadRequest("every input must have the same batch size")
    if (document.get("parameters") or {}).get("binary_data_output"):
        raise BadRequest("binary outputs are not served by the lean reference; ask for JSON")
    wanted = None
    if document.get("outputs") is not None:
        outputs = document["outputs"]
        if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
            raise BadRequest("'outputs' must be a list of objects")
        wanted = {o.get("name") for o in outputs}
        if not wanted <= model.outputs.keys():
            raise BadRequest(f"unknown outputs {sorted(map(str, wanted - model.outputs.keys()))}")
        if any((o.get("parameters") or {}).get("binary_data") for o in outputs):
            raise BadRequest("binary outputs are not served by the lean reference; ask for JSON")
    return arrays, ident, wanted


def encode(model: Model, ident: str | None, outputs: list[tuple[str, np.ndarray]], wanted: set[str] | None) -> bytes:
    """The v2 JSON answer; raises ValueError when the model's outputs are not its config's."""
    entries: list[dict[str, Any]] = []
    for name, array in outputs:
        spec = model.outputs.get(name)
        if spec is None or array.dtype != spec.dtype:
            raise ValueError(f"the model answered {name!r} as {_NAMES.get(array.dtype, array.dtype)}; its config "
                             f"declares {spec.datatype if spec else 'no such output'}")
        if wanted is None or name in wanted:
            entries.append({"name": name, "datatype": spec.datatype, "shape": list(array.shape), "data": array.ravel()})
    document: dict[str, Any] = {"model_name": model.name, "model_version": model.version}
    if ident is not None:
        document["id"] = ident
    document["outputs"] = entries
    for entry in entries:
        data = entry["data"]
        if data.dtype.kind == "f" and not np.isfinite(data).all():  # JSON has none: Triton's words for them
            entry["data"] = orjson.Fragment(b"[" + b",".join(
                orjson.dumps(v, option=orjson.OPT_SERIALIZE_NUMPY) if np.isfinite(v)
                else b"NaN" if np.isnan(v) else b"Infinity" if v > 0 else b"-Infinity" for v in data) + b"]")
    return orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)


def _error(message: str) -> bytes:
    return orjson.dumps({"error": message})


class _Hop:
    """The server's side of the pipes to the model process: one write per loop turn, callbacks by id."""

    def __init__(self, model: Model) -> None:
        self._model = model
        self._loop = asyncio.get_running_loop()
        self._waiting: dict[int, Callable[[bool, Any], None]] = {}
        self._outgoing: list[tuple[int, dict[str, np.ndarray]]] = []
        self._next = 0
        self._buffer = bytearray()
        self._ready = self._loop.create_future()
        self._writer: asyncio.WriteTransport | None = None
        self.process: subprocess.Popen | None = None

    async def start(self) -> None:
        child_read, parent_write = os.pipe()
        parent_read, child_write = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.lean_model", str(self._model.file), json.dumps(self._model.config),
             str(child_read), str(child_write)], pass_fds=(child_read, child_write), cwd=_ROOT)
        os.close(child_read)
        os.close(child_write)
        # The transports own these files and close them.
        reader = open(parent_read, "rb", buffering=0)  # noqa: SIM115
        writer = open(parent_write, "wb", buffering=0)  # noqa: SIM115
        await self._loop.connect_read_pipe(lambda: _HopReader(self), reader)
        self._writer, _ = await self._loop.connect_write_pipe(asyncio.Protocol, writer)
        await self._ready

    def send(self, inputs: dict[str, np.ndarray], answer: Callable[[bool, Any], None]) -> None:
        if self._writer is None or self._writer.is_closing():
            answer(False, "the model process is gone")
            return
        self._next += 1
        self._waiting[self._next] = answer
        self._outgoing.append((self._next, inputs))
        if len(self._outgoing) == 1:
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        outgoing, self._outgoing = self._outgoing, []
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(frame(outgoing))

    def received(self, data: bytes) -> None:
        self._buffer += data
        for message in split_frames(self._buffer):
            if message == "ready":
                self._ready.set_result(None)
                continue
            for ident, ok, result in message:
                self._waiting.pop(ident)(ok, result)

    def lost(self) -> None:
        if not self._ready.done():
            self._ready.set_exception(RuntimeError("the model process exited before it was ready"))
        if self._writer is not None:
            self._writer.close()
        waiting, self._waiting = self._waiting, {}
        for answer in waiting.values():
            answer(False, "the model process exited")

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()  # the model process reads the end of its input, finalizes and exits
        if self.process is not None:
            await asyncio.to_thread(self.process.wait, 10)


class _HopReader(asyncio.Protocol):
    def __init__(self, hop: _Hop) -> None:
        self._hop = hop

    def data_received(self, data: bytes) -> None:
        self._hop.received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._hop.lost()


class _Server:
    def __init__(self, model: Model, hop: _Hop, token: str | None) -> None:
        self._model = model
        self._hop = hop
        self._authorization = None if token is None else f"Bearer {token}".encode()

    def dispatch(self, method: bytes, target: bytes, authorization: bytes | None, body: bytes,
                 respond: Respond) -> None:
        path = target.split(b"?", 1)[0]
        if method == b"GET" and path in (b"/v2/health/ready", b"/v2/health/live"):
            respond(200, b"")
            return
        if self._authorization is not None and not hmac.compare_digest(authorization or b"", self._authorization):
            respond(401, _error("send 'Authorization: Bearer <token>' with the server's token"))
            return
        match = _INFER.fullmatch(path) if method == b"POST" else None
        if match is None:
            respond(404, _error(f"no route {method.decode()} {path.decode(errors='replace')}; this server answers "
                                f"POST /v2/models/{self._model.name}/infer and GET /v2/health/ready"))
        elif match.group(1).decode() != self._model.name or match.group(2) not in (None, self._model.version.encode()):
            respond(404, _error(f"unknown model or version; this server serves '{self._model.name}' version "
                                f"{self._model.version}"))
        else:
            self._infer(body, respond)

    def _infer(self, body: bytes, respond: Respond) -> None:
        try:
            inputs, ident, wanted = decode(self._model, body)
        except BadRequest as exc:
            respond(400, _error(str(exc)))
            return

        def answer(ok: bool, result: Any) -> None:
            if not ok:
                respond(500, _error(f"model '{self._model.name}': {result}"))
                return
            try:
                respond(200, encode(self._model, ident, result, wanted))
            except ValueError as exc:
                respond(500, _error(str(exc)))

        self._hop.send(inputs, answer)


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


_date = [0, b""]


def _response(status: int, body: bytes, keep_alive: bool) -> bytes:
    now = int(time.time())
    if now != _date[0]:
        _date[:] = [now, formatdate(now, usegmt=True).encode()]
    return b"".join((b"HTTP/1.1 %d %s\r\nDate: %s\r\nContent-Length: %d\r\n" % (status, _REASONS[status], _date[1],
                                                                                 len(body)),
                     b"Content-Type: application/json\r\n" if body else b"",
                     b"" if keep_alive else b"Connection: close\r\n", b"\r\n", body))


class _Connection(asyncio.Protocol):
    """One client connection: httptools' callbacks gather a request, the server answers it through a
    callback, answers go out in request order."""

    def __init__(self, server: _Server) -> None:
        self._server = server
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._slots: deque[list[bytes | None]] = deque()
        self._closing = False
        self._paused = False
        self._target = b""
        self._authorization: bytes | None = None
        self._body: list[bytes] = []
        self._head = self._size = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None  # answers still to come are dropped

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            refused = exc.__context__ if isinstance(exc.__context__, _Refused) else _Refused(400, str(exc))
            self._refuse(refused.status, str(refused))
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrades are not served")
        except httptools.HttpParserError as exc:
            self._refuse(400, f"malformed HTTP request: {exc}")

    def on_message_begin(self) -> None:
        self._target, self._authorization, self._body, self._head, self._size = b"", None, [], 0, 0

    def _count_head(self, size: int) -> None:
        self._head += size
        if self._head > MAX_HEAD:
            raise _Refused(431, f"the request head is over {MAX_HEAD} bytes")

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        self._target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        if name.lower() == b"authorization":
            self._authorization = value

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > MAX_BODY:
            raise _Refused(413, f"the body is over {MAX_BODY} bytes")
        self._body.append(body)

    def on_message_complete(self) -> None:
        slot: list[bytes | None] = [None]
        self._slots.append(slot)
        keep_alive = self._parser.should_keep_alive()
        if not keep_alive:
            self._closing = True
        elif len(self._slots) > _PIPELINED and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

        def respond(status: int, body: bytes) -> None:
            slot[0] = _response(status, body, keep_alive)
            self._write_ready()

        self._server.dispatch(self._parser.get_method(), self._target, self._authorization, b"".join(self._body),
                              respond)

    def _refuse(self, status: int, message: str) -> None:
        self._closing = True
        self._slots.append([_response(status, _error(message), False)])
        self._write_ready()

    def _write_ready(self) -> None:
        ready = []
        while self._slots and self._slots[0][0] is not None:
            ready.append(self._slots.popleft()[0])
        if self._transport is None or not ready:
            return
        self._transport.write(b"".join(ready))  # type: ignore[arg-type]
        if self._closing and not self._slots:
            self._transport.close()
        elif self._paused and not self._slots:
            self._paused = False
            self._transport.resume_reading()


async def _serve(args: argparse.Namespace) -> None:
    model = read_model(args.model_dir)
    hop = _Hop(model)
    await hop.start()
    loop = asyncio.get_running_loop()
    server = _Server(model, hop, args.token)
    listener = await loop.create_server(lambda: _Connection(server), args.host, args.port, backlog=1024)
    port = listener.sockets[0].getsockname()[1]
    print(f"lean reference serving {model.name} on http://{args.host}:{port}", flush=True)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    listener.close()
    await hop.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, required=True, help="a Triton model directory (Python backend)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free one")
    parser.add_argument("--token", help="require 'Authorization: Bearer TOKEN' on all but health")
    args = parser.parse_args(argv)
    uvloop.run(_serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
