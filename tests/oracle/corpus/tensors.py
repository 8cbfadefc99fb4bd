"""One inference request described once, rendered as HTTP JSON, HTTP binary and gRPC messages."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from tests.oracle.wire import Grpc, Http

__all__ = ["In", "Out", "Request", "grpc_parameters", "raw_bytes"]

_NUMPY = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
          "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
          "FP32": np.float32, "FP64": np.float64}
_CONTENTS = {"BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
             "UINT32": "uint_contents", "UINT64": "uint64_contents", "INT8": "int_contents",
             "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
             "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}


def raw_bytes(datatype: str, data: list) -> bytes:
    """Triton's binary form: little-endian arrays, BYTES as 4-byte length prefixes."""
    if datatype == "BYTES":
        items = [item.encode() if isinstance(item, str) else bytes(item) for item in data]
        return b"".join(struct.pack("<I", len(item)) + item for item in items)
    return np.asarray(data, dtype=_NUMPY[datatype]).tobytes()


@dataclass(frozen=True)
class In:
    name: str
    datatype: str
    shape: list[int]
    data: list | None = None
    """Flat values (None: no data, e.g. an input in shared memory)."""
    binary: bool = False
    """HTTP: send the data as a binary tail (binary_data_size) instead of JSON."""
    parameters: dict[str, Any] = field(default_factory=dict)
    raw: bytes | None = None
    """Exact bytes for the binary form (a deliberately wrong size); default: from data."""

    def bytes(self) -> bytes:
        return self.raw if self.raw is not None else raw_bytes(self.datatype, self.data or [])


@dataclass(frozen=True)
class Out:
    name: str
    binary: bool | None = None
    classification: int | None = None
    parameters: dict[str, Any] = field(default_factory=dict)

    def all_parameters(self) -> dict[str, Any]:
        merged = dict(self.parameters)
        if self.binary is not None:
            merged["binary_data"] = self.binary
        if self.classification is not None:
            merged["classification"] = self.classification
        return merged


@dataclass(frozen=True)
class Request:
    model: str
    inputs: list[In]
    outputs: list[Out] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    id: str | None = None
    version: str = ""

    # -- HTTP ------------------------------------------------------------------------------------------
    @property
    def path(self) -> str:
        version = f"/versions/{self.version}" if self.version else ""
        return f"/v2/models/{self.model}{version}/infer"

    def http_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if self.id is not None:
            body["id"] = self.id
        if self.parameters:
            body["parameters"] = self.parameters
        inputs = []
        for tensor in self.inputs:
            entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
            parameters = dict(tensor.parameters)
            if tensor.binary:
                parameters["binary_data_size"] = len(tensor.bytes())
            elif tensor.data is not None:
                entry["data"] = tensor.data
            if parameters:
                entry["parameters"] = parameters
            inputs.append(entry)
        body["inputs"] = inputs
        if self.outputs is not None:
            body["outputs"] = [{"name": out.name, **({"parameters": out.all_parameters()}
                                                      if out.all_parameters() else {})} for out in self.outputs]
        return body

    def http(self, headers: tuple[tuple[str, str], ...] = ()) -> Http:
        """JSON, with binary tails for the inputs marked binary (then Inference-Header-Content-Length)."""
        header = json.dumps(self.http_json()).encode()
        tails = b"".join(tensor.bytes() for tensor in self.inputs if tensor.binary)
        wanted = [("Content-Type", "application/json")]
        if tails:
            wanted = [("Content-Type", "application/octet-stream"),
                      ("Inference-Header-Content-Length", str(len(header)))]
        return Http("POST", self.path, header + tails, (*wanted, *headers))

    # -- gRPC ------------------------------------------------------------------------------------------
    def grpc_message(self, typed: bool = False) -> service_pb2.ModelInferRequest:
        """raw_input_contents as tritonclient sends them, or typed ``contents`` when ``typed``."""
        message = service_pb2.ModelInferRequest(model_name=self.model, model_version=self.version,
                                                id=self.id or "")
        grpc_parameters(message.parameters, self.parameters)
        for tensor in self.inputs:
            entry = message.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
            grpc_parameters(entry.parameters, tensor.parameters)
            if tensor.data is None and tensor.raw is None:
                continue
            if typed and tensor.raw is None:
                field_name = _CONTENTS[tensor.datatype]
                values = [v.encode() if isinstance(v, str) else v for v in tensor.data or []]
                getattr(entry.contents, field_name).extend(values)
            else:
                message.raw_input_contents.append(tensor.bytes())
        for out in self.outputs or []:
            parameters = {k: v for k, v in out.all_parameters().items() if k not in ("binary_data", "classification")}
            output = message.outputs.add(name=out.name)
            grpc_parameters(output.parameters, parameters)
            if out.classification is not None:
                output.parameters["classification"].int64_param = out.classification
        return message

    def grpc(self, typed: bool = False) -> Grpc:
        return Grpc("ModelInfer", self.grpc_message(typed))


def grpc_parameters(target: Any, parameters: dict[str, Any]) -> None:
    """Fill a protobuf map<string, InferParameter> the way tritonclient does."""
    for key, value in parameters.items():
        if isinstance(value, bool):
            target[key].bool_param = value
        elif isinstance(value, int) and value >= 2**63:
            target[key].uint64_param = value
        elif isinstance(value, int):
            target[key].int64_param = value
        elif isinstance(value, float):
            target[key].double_param = value
        else:
            target[key].string_param = str(value)
