"""Tensors between requests and shared-memory regions: the step every front end shares.

``bind`` runs before a request is scheduled:

- each input in shared memory: its region is leased, the offset and size are checked against the
  region, the size against the declared shape and datatype (before anything is allocated), the
  bytes are reserved on the request's memory account and copied out. The copy is the request's own:
  a region rewritten or shrunk afterwards cannot touch what the model reads.
- each output to go into shared memory: its region is leased and the bounds are checked, so a
  request that could not deliver its outputs never runs; the response is written there
  (``Binding.write``).

Every region a request names stays leased until the binding closes (the response written), as
Triton holds them: a region unregistered meanwhile stays listed until then, the request finishes
into the region it named, and the region then leaves the table and closes.

Copies of more than a MiB run on a worker thread; the region stays leased until that thread is
done, even when the request is cancelled first (a thread cannot be stopped).
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable

import numpy as np

from appliance.core.errors import InputMismatch, InvalidInput
from appliance.core.tensors import decode_bytes_tensor, element_size, encode_bytes_tensor, numpy_dtype
from appliance.engine.tensor_checks import byte_size_words
from appliance.engine.types import InferInput, InferRequest, InferResponse, SharedMemoryInput, SharedMemoryRef
from appliance.protocol.shared_memory.table import Lease, Region, RegionTable

__all__ = ["Binding", "bind"]

_OFF_LOOP_BYTES = 1 << 20
# What one BYTES element costs beyond its text: a pointer in the object array and a bytes object.
_BYTES_ELEMENT_OVERHEAD = 8 + 33


def _check_bounds(region: Region, ref: SharedMemoryRef, what: str) -> None:
    """Triton's checks (and words) for a tensor's place in a region, on every use."""
    if ref.offset >= region.byte_size:
        raise InvalidInput(
            f"Invalid offset for shared memory region: '{ref.region}' ({what}: offset {ref.offset}, the region "
            f"has {region.byte_size} bytes)"
        )
    if ref.offset + ref.byte_size >= 1 << 64:
        raise InvalidInput(  # 2.51's words, then the newer Triton's (its L0_shared_memory checks those)
            f"Invalid offset + byte size for shared memory region: '{ref.region}' (Integer overflow detected: "
            f"byte_size {ref.byte_size} + offset {ref.offset} does not fit 64 bits; {what})"
        )
    if ref.offset + ref.byte_size > region.byte_size:
        raise InvalidInput(
            f"Invalid offset + byte size for shared memory region: '{ref.region}' ({what}: offset {ref.offset} + "
            f"byte size {ref.byte_size} is beyond the region's {region.byte_size} bytes)"
        )


async def _off_loop(lease: Lease, work: Callable[[], None]) -> None:
    """``work`` on a worker thread; ``lease`` is given back when the thread is done."""
    future = asyncio.get_running_loop().run_in_executor(None, work)

    def done(finished: asyncio.Future) -> None:
        if not finished.cancelled():
            finished.exception()  # retrieved: a cancelled request no longer awaits it
        lease.release()

    future.add_done_callback(done)
    await asyncio.shield(future)


async def _copy(lease: Lease, work: Callable[[], None], size: int) -> None:
    """Run a copy under ``lease`` and give the lease back once the copy is over."""
    if size <= _OFF_LOOP_BYTES:
        with lease:
            work()
    else:
        await _off_loop(lease, work)


async def _read_input(lease: Lease, shared: SharedMemoryInput, reserve: Callable[[int], None]) -> InferInput:
    """Copy one input out of its region under ``lease`` (given back once the copy is over)."""
    name, datatype, shape, ref = shared.name, shared.datatype, shared.shape, shared.source
    what = f"input '{name}'"
    try:
        _check_bounds(lease.region, ref, what)
        count = math.prod(shape)
        itemsize = element_size(datatype)
        if itemsize is not None and ref.byte_size != count * itemsize:
            raise InputMismatch(
                f"{what}: shape {list(shape)} of {datatype} needs {count * itemsize} bytes, "
                f"shared_memory_byte_size is {ref.byte_size}",
                byte_size_words(name, count * itemsize, ref.byte_size),
            )
        # BYTES: at most one element per 4 bytes whatever the shape claims (decoding refuses a mismatch).
        reserve(ref.byte_size + (min(count, ref.byte_size // 4) * _BYTES_ELEMENT_OVERHEAD if itemsize is None else 0))
        buffer = np.empty(ref.byte_size, dtype=np.uint8)
    except BaseException:
        lease.release()
        raise
    region = lease.region
    await _copy(lease, lambda: region.read(ref.offset, buffer.data), ref.byte_size)
    if itemsize is None:
        return InferInput(name, datatype, decode_bytes_tensor(buffer.data, count, name).reshape(shape))
    return InferInput(name, datatype, buffer.view(numpy_dtype(datatype)).reshape(shape))


def _raw(datatype: str, data: np.ndarray) -> memoryview:
    """An output as Triton lays it out in a region: the array's bytes, or length-prefixed BYTES."""
    if datatype == "BYTES":
        return memoryview(encode_bytes_tensor(data))
    return np.ascontiguousarray(data).reshape(-1).view(np.uint8).data


class Binding:
    """The regions one request holds (its outputs' and inputs'); use it as a context manager around the
    inference."""

    def __init__(self, targets: dict[str, tuple[Lease, SharedMemoryRef]]) -> None:
        self._targets = targets
        self._inputs: list[Lease] = []
        """Leases on the input regions: they keep an unregistered region listed until the request ends."""

    async def write(self, response: InferResponse) -> None:
        """Write each output bound to a region there and mark it, so the response carries the region's
        parameters and no data."""
        for output in response.outputs:
            target = self._targets.get(output.name)
            if target is None:
                continue
            lease, ref = target
            raw = _raw(output.datatype, output.data)
            if len(raw) > ref.byte_size:
                raise InvalidInput(
                    f"shared memory size specified with the request for output '{output.name}' ({ref.byte_size} "
                    f"bytes) should be at least {len(raw)} bytes to hold the results"
                )
            write = functools.partial(lease.region.write, ref.offset, raw)
            await _copy(lease.clone(), write, len(raw))
            output.shared_memory = SharedMemoryRef(ref.region, len(raw), ref.offset)

    def close(self) -> None:
        targets, self._targets = self._targets, {}
        inputs, self._inputs = self._inputs, []
        for lease in [lease for lease, _ in targets.values()] + inputs:
            lease.release()

    def __enter__(self) -> Binding:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


async def bind(table: RegionTable, request: InferRequest, *, local: bool, reserve: Callable[[int], None]) -> Binding:
    """Read ``request``'s shared-memory inputs into ``request.inputs`` and lease its output regions.

    ``local``: whether the client is on this host (``client_shm = local`` refuses the others).
    ``reserve(size)``: the request's memory account, called before each input is allocated."""
    table.check_client(local)
    binding = Binding({})
    try:
        for output in request.outputs:
            ref = output.shared_memory
            if ref is None:
                continue
            if output.name in binding._targets:
                raise InvalidInput(f"output '{output.name}' is requested more than once")
            if output.classification:
                raise InvalidInput(f"output '{output.name}': classification results cannot go to shared memory")
            lease = table.lease(ref.region)
            binding._targets[output.name] = (lease, ref)
            _check_bounds(lease.region, ref, f"output '{output.name}'")
        for shared in request.shared_inputs:
            lease = table.lease(shared.source.region)
            binding._inputs.append(lease.clone())
            request.inputs.append(await _read_input(lease, shared, reserve))
        request.shared_inputs = []
    except BaseException:
        binding.close()
        raise
    return binding
