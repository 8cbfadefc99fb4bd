"""System (and CUDA) shared memory: register, status, inference through regions, unregister, refusals."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from tests.oracle.corpus.case import Case, get, post
from tests.oracle.corpus.tensors import In, Out, Request
from tests.oracle.wire import Grpc

__all__ = ["Regions", "regions", "shared_memory_cases"]

_SIZE = 128


@dataclass
class Regions:
    """Two POSIX objects the corpus registers with both servers: inputs (add_sub's two) and outputs."""

    inputs: shared_memory.SharedMemory
    outputs: shared_memory.SharedMemory

    @property
    def input_key(self) -> str:
        return "/" + self.inputs.name.lstrip("/")

    @property
    def output_key(self) -> str:
        return "/" + self.outputs.name.lstrip("/")

    def clear_outputs(self) -> None:
        self.outputs.buf[:_SIZE] = bytes(_SIZE)

    def read_outputs(self) -> dict[str, str]:
        return {"output_region": bytes(self.outputs.buf[:_SIZE]).hex()}


@contextmanager
def regions() -> Iterator[Regions]:
    tag = f"oracle-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    made = Regions(shared_memory.SharedMemory(f"{tag}-in", create=True, size=_SIZE),
                   shared_memory.SharedMemory(f"{tag}-out", create=True, size=_SIZE))
    try:
        made.inputs.buf[:64] = np.arange(16, dtype=np.int32).tobytes()
        made.inputs.buf[64:128] = np.full(16, 3, dtype=np.int32).tobytes()
        yield made
    finally:
        for memory in (made.inputs, made.outputs):
            memory.close()
            try:
                memory.unlink()
            except FileNotFoundError:
                pass


def _shm_input(name: str, offset: int, size: int = 64, region: str = "in") -> In:
    return In(name, "INT32", [1, 16], None, parameters={"shared_memory_region": region,
                                                          "shared_memory_byte_size": size,
                                                          "shared_memory_offset": offset})


def _shm_output(name: str, offset: int, size: int = 64, region: str = "out") -> Out:
    return Out(name, parameters={"shared_memory_region": region, "shared_memory_byte_size": size,
                                 "shared_memory_offset": offset})


def _infer_cases(made: Regions) -> list[tuple[str, Request]]:
    both_in = [_shm_input("INPUT0", 0), _shm_input("INPUT1", 64)]
    return [
        ("inputs_and_outputs", Request("add_sub", both_in, [_shm_output("OUTPUT0", 0), _shm_output("OUTPUT1", 64)])),
        ("inputs_only", Request("add_sub", both_in)),
        ("output_and_plain", Request("add_sub", both_in, [_shm_output("OUTPUT0", 64), Out("OUTPUT1")])),
        ("input_past_end", Request("add_sub", [_shm_input("INPUT0", 96), _shm_input("INPUT1", 64)])),
        ("input_offset_overflow", Request("add_sub", [_shm_input("INPUT0", 2**64 - 32), _shm_input("INPUT1", 64)])),
        ("input_size_wrong", Request("add_sub", [_shm_input("INPUT0", 0, 32), _shm_input("INPUT1", 64)])),
        ("output_too_small", Request("add_sub", both_in, [_shm_output("OUTPUT0", 0, 32)])),
        ("output_past_end", Request("add_sub", both_in, [_shm_output("OUTPUT0", 100)])),
        ("output_size_overflow", Request("add_sub", both_in, [_shm_output("OUTPUT0", 32, 2**64 - 32)])),
        ("unknown_region", Request("add_sub", [_shm_input("INPUT0", 0, region="nowhere"), _shm_input("INPUT1", 64)])),
    ]


def shared_memory_cases(made: Regions) -> list[Case]:
    cases = _http(made)
    cases += _grpc(made)
    return cases


def _register_body(key: str, offset: int = 0, size: int = _SIZE) -> dict:
    return {"key": key, "offset": offset, "byte_size": size}


def _http(made: Regions) -> list[Case]:
    base = "/v2/systemsharedmemory"
    cases = [
        get("shm.status.empty", f"{base}/status"),
        post("shm.register.in", f"{base}/region/in/register", _register_body(made.input_key)),
        post("shm.register.out", f"{base}/region/out/register", _register_body(made.output_key)),
        get("shm.status.all", f"{base}/status"),
        get("shm.status.one", f"{base}/region/in/status"),
        get("shm.status.unknown", f"{base}/region/nowhere/status"),
        post("shm.register.same_name", f"{base}/region/in/register", _register_body(made.input_key)),
        post("shm.register.missing_object", f"{base}/region/ghost/register", _register_body("/oracle-no-such-object")),
        post("shm.register.bad_key", f"{base}/region/bad/register", _register_body("../etc/passwd")),
        post("shm.register.reserved_prefix", f"{base}/region/reserved/register",
             _register_body("/triton_python_backend_shm_region_1")),
        post("shm.register.offset_past_end", f"{base}/region/far/register", _register_body(made.input_key, 4096, 64)),
        post("shm.register.too_big", f"{base}/region/big/register", _register_body(made.input_key, 0, 1 << 20)),
        # (byte_size 0 over HTTP is left out: tritonserver 2.51 drops the connection, then stalls the next call.)
        post("shm.register.missing_key", f"{base}/region/nokey/register", {"offset": 0, "byte_size": 64}),
        post("shm.register.negative_offset", f"{base}/region/neg/register", _register_body(made.input_key, -1)),
    ]
    for name, request in _infer_cases(made):
        cases.append(Case(f"http.shm.infer.{name}", request.http(), made.clear_outputs, made.read_outputs))
    cases += [
        post("shm.unregister.out", f"{base}/region/out/unregister"),
        post("shm.unregister.unknown", f"{base}/region/nowhere/unregister"),
        get("shm.status.after_one", f"{base}/status"),
        post("shm.unregister.all", f"{base}/unregister"),
        get("shm.status.after_all", f"{base}/status"),
        get("cudashm.status", "/v2/cudasharedmemory/status"),
        post("cudashm.register", "/v2/cudasharedmemory/region/gpu/register",
             {"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 64}),
        post("cudashm.unregister", "/v2/cudasharedmemory/unregister"),
    ]
    return cases


def _grpc(made: Regions) -> list[Case]:
    def register(name: str, region: str, key: str, offset: int = 0, size: int = _SIZE) -> Case:
        message = pb.SystemSharedMemoryRegisterRequest(name=region, key=key, offset=offset, byte_size=size)
        return Case(f"grpc.shm.register.{name}", Grpc("SystemSharedMemoryRegister", message))

    def status(name: str, region: str = "") -> Case:
        return Case(f"grpc.shm.status.{name}", Grpc("SystemSharedMemoryStatus",
                                                    pb.SystemSharedMemoryStatusRequest(name=region)))

    def unregister(name: str, region: str = "") -> Case:
        return Case(f"grpc.shm.unregister.{name}", Grpc("SystemSharedMemoryUnregister",
                                                        pb.SystemSharedMemoryUnregisterRequest(name=region)))

    cases = [
        status("empty"),
        register("in", "in", made.input_key),
        register("out", "out", made.output_key),
        status("all"),
        status("one", "in"),
        status("unknown", "nowhere"),
        register("same_name", "in", made.input_key),
        register("missing_object", "ghost", "/oracle-no-such-object"),
        register("bad_key", "bad", "../etc/passwd"),
        register("reserved_prefix", "reserved", "/triton_python_backend_shm_region_1"),
        register("offset_past_end", "far", made.input_key, 4096, 64),
        register("too_big", "big", made.input_key, 0, 1 << 20),
        register("size_zero", "zero", made.input_key, 0, 0),
    ]
    for name, request in _infer_cases(made):
        cases.append(Case(f"grpc.shm.infer.{name}", request.grpc(), made.clear_outputs, made.read_outputs))
    cases += [
        unregister("out", "out"),
        unregister("unknown", "nowhere"),
        status("after_one"),
        unregister("all"),
        status("after_all"),
        Case("grpc.cudashm.status", Grpc("CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest())),
        Case("grpc.cudashm.register", Grpc("CudaSharedMemoryRegister", pb.CudaSharedMemoryRegisterRequest(
            name="gpu", raw_handle=b"\0" * 64, device_id=0, byte_size=64))),
        Case("grpc.cudashm.unregister", Grpc("CudaSharedMemoryUnregister", pb.CudaSharedMemoryUnregisterRequest())),
    ]
    return cases
