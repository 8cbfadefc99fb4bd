"""Triton's response cache: the outputs of models with ``response_cache { enable: true }``, kept for the
whole server under one byte bound (``cache_config = local,size=<bytes>``), least recently used out first.

A request's key is a keyed BLAKE3 hash (a key drawn at start, so no client can aim at another's key) over
what decides its answer: the model version that ran it (a reload is a new
version of the cache's contents, so a model whose files changed never answers from its old outputs), every
input's name, datatype, shape and bytes, the outputs it asked the model for, and the request parameters
the model can read. What only shapes the response on its way out (classification, binary or JSON output,
shared-memory regions, the request id) is not in the key: the cache keeps the model's raw outputs, and each
request that hits them post-processes and encodes them again. Triton's key is a 64-bit hash of the
inputs' names and bytes only (two shapes of the same bytes collide there); a 256-bit keyed digest makes a
collision, accidental or crafted by a client, out of reach. BLAKE3 hashes a 600 KB frame in about 0.1 ms
(SHA-256 takes 0.35 ms), which is what a request that misses pays.

The cache's bytes are its own: they are bounded by ``size`` and never counted against the request memory
budget. Everything here runs on the event loop (no locks).

``ResponseStore`` is what a model version sees of a cache, this one or the Redis one
(appliance.engine.redis_cache): a version asks it for its owner (namespace), keys its requests, fetches and
stores outputs, and forgets its entries when it closes. Each fetch and store names the version's
``OutputForms`` and the request's batch size: a cache that others write to (Redis) serves an entry only when
its outputs are the ones the model's config declares.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import blake3
import numpy as np

from appliance.backends.base import Outputs
from appliance.core.tensors import v2_datatype
from appliance.engine.types import InferInput

__all__ = ["OutputForms", "ResponseCache", "ResponseStore", "lookup_gauges", "request_key"]

ENTRY_OVERHEAD = 256
"""Bytes an entry costs beyond its tensors (the key, the bookkeeping), counted against the size."""
_BYTES_ITEM_OVERHEAD = 33
"""What CPython spends on one ``bytes`` object besides its contents."""
_OWNERS = itertools.count(1)
_KEY = os.urandom(32)
"""This process's hashing key: keys are never shown, and a restart empties the cache anyway."""


def request_key(owner: bytes, inputs: Sequence[InferInput], outputs: Iterable[str],
                parameters: str = "", hash_key: bytes = _KEY) -> bytes:
    """The cache key of a request to the version ``owner`` (``ResponseCache.owner()``): its inputs (name,
    datatype, shape, bytes), the outputs it asked the model for, and ``parameters``, the request
    parameters as the model reads them (JSON text; empty when there are none). ``hash_key``: this
    process's own (the default), or a fixed one where several servers share the keys."""
    digest = blake3.blake3(owner, key=hash_key)
    for tensor in sorted(inputs, key=lambda t: t.name):
        data = tensor.data
        digest.update(f"\0i{len(tensor.name)}:{tensor.name}|{tensor.datatype}|{data.shape}|".encode())
        if data.dtype.hasobject:  # BYTES: each element length-prefixed, so no two splits read alike
            for item in data.flat:
                raw = item if isinstance(item, bytes) else str(item).encode()
                digest.update(len(raw).to_bytes(8, "little"))
                digest.update(raw)
        else:
            digest.update(np.ascontiguousarray(data).reshape(-1).view(np.uint8).data)
    for name in sorted(set(outputs)):
        digest.update(f"\0o{len(name)}:{name}".encode())
    if parameters:
        digest.update(b"\0p" + parameters.encode())
    return digest.digest()


@dataclasses.dataclass(frozen=True, slots=True)
class OutputForms:
    """A model version's outputs as its runtime makes them: each one's datatype and dims (the config's
    ``dims``, or its ``reshape``), without the batch dimension; what a response read from a cache others
    write to must match."""

    model: str
    outputs: Mapping[str, tuple[str, tuple[int, ...]]]
    batched: bool

    def mismatch(self, outputs: Mapping[str, np.ndarray], batch_size: int) -> str | None:
        """Why ``outputs`` cannot be this model's answer to a request of ``batch_size``, or None when they
        can: every output declared, of its datatype, of its rank, each fixed dimension as declared (-1 takes
        any size) and, where the model batches, the request's batch size first."""
        for name, value in outputs.items():
            array = np.asarray(value)
            form = self.outputs.get(name)
            if form is None:
                return f"output {name!r} is not in model {self.model!r}'s config"
            datatype, dims = form
            try:
                found = v2_datatype(array.dtype)
            except ValueError:
                found = str(array.dtype)
            if found != datatype:
                return f"output {name!r} of model {self.model!r} is {found}; its config declares {datatype}"
            shape = tuple(array.shape)
            if self.batched:
                if not shape or shape[0] != batch_size:
                    return (f"output {name!r} of model {self.model!r} has shape {list(shape)}; a request of batch "
                            f"size {batch_size} needs that many rows")
                shape = shape[1:]
            if len(shape) != len(dims) or any(want not in (-1, got) for want, got in zip(dims, shape)):
                return (f"output {name!r} of model {self.model!r} has shape {list(array.shape)}; its config "
                        f"declares dims {list(dims)}{' after the batch dimension' if self.batched else ''}")
        return None


@dataclasses.dataclass(slots=True)
class _Entry:
    outputs: Outputs
    size: int
    owner: bytes


def _stored(array: np.ndarray) -> np.ndarray:
    """The array the cache keeps: compact (a view of a whole batch's output would keep the batch alive
    while only its rows are counted) and read-only (every hit hands out the same array)."""
    array = np.asarray(array)
    if array.base is not None and not (isinstance(array.base, np.ndarray) and array.base.nbytes == array.nbytes):
        array = array.copy()
    array.flags.writeable = False
    return array


def _size(outputs: Mapping[str, np.ndarray]) -> int:
    total = ENTRY_OVERHEAD
    for name, array in outputs.items():
        total += len(name) + array.nbytes
        if array.dtype.hasobject:
            total += sum(len(item) + _BYTES_ITEM_OVERHEAD if isinstance(item, bytes) else 64 for item in array.flat)
    return total


class ResponseStore(Protocol):
    """A response cache as a model version uses it (the local one below, or Redis)."""

    def version_owner(self, identity: bytes | None) -> bytes:
        """The namespace of one loaded version's entries. ``identity``: a digest of the version's name,
        config and files (computed only where ``shared``), None where the cache needs none."""
        ...

    @property
    def shared(self) -> bool:
        """Whether other servers read this cache's entries (then owners come from content, not loads)."""
        ...

    def key(self, owner: bytes, inputs: Sequence[InferInput], outputs: Iterable[str], parameters: str) -> bytes: ...

    async def fetch(self, key: bytes, elapsed_ns: int, forms: OutputForms, batch_size: int) -> Outputs | None:
        """The outputs stored under ``key``, or None (a miss, or a cache that could not answer in time).
        ``forms``, ``batch_size``: what the outputs must look like (see ``OutputForms.mismatch``)."""
        ...

    def store(self, key: bytes, owner: bytes, outputs: Mapping[str, np.ndarray],
              parameters: Mapping[str, object] | None, forms: OutputForms, batch_size: int) -> Outputs | None:
        """Keep ``outputs``; what to answer with (the stored outputs) or None to answer with ``outputs``."""
        ...

    def record_insertion(self, elapsed_ns: int) -> None: ...

    def forget(self, owner: bytes) -> int: ...

    def gauges(self) -> list[tuple[str, str, float]]:
        """The cache's own metrics: (name, help, value), Triton's names where Triton has them."""
        ...


class ResponseCache:
    """One LRU cache of responses for every model of the server, bounded in bytes."""

    shared = False

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        """Bytes held by the entries (tensors and overhead)."""
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.insertions = 0
        self.lookup_ns = 0
        """Time spent looking keys up, hit or miss (what Triton's nv_cache_lookup_duration counts)."""
        self.insertion_ns = 0

    @staticmethod
    def owner() -> bytes:
        """A fresh namespace for one loaded model version's entries (see ``forget``)."""
        return next(_OWNERS).to_bytes(8, "little")

    def version_owner(self, identity: bytes | None) -> bytes:
        return self.owner()  # a reload is a new namespace; the old one's entries go when it closes

    def key(self, owner: bytes, inputs: Sequence[InferInput], outputs: Iterable[str], parameters: str) -> bytes:
        return request_key(owner, inputs, outputs, parameters)

    async def fetch(self, key: bytes, elapsed_ns: int, forms: OutputForms, batch_size: int) -> Outputs | None:
        return self.lookup(key, elapsed_ns)  # this process's own entries: no one else writes them

    def store(self, key: bytes, owner: bytes, outputs: Mapping[str, np.ndarray],
              parameters: Mapping[str, object] | None, forms: OutputForms, batch_size: int) -> Outputs | None:
        return self.insert(key, owner, outputs, parameters)

    @property
    def entries(self) -> int:
        return len(self._entries)

    @property
    def lookups(self) -> int:
        return self.hits + self.misses

    @property
    def utilization(self) -> float:
        """Share of the size in use, 0.0 to 1.0 (Triton's nv_cache_util)."""
        return self.used / self.capacity

    def lookup(self, key: bytes, elapsed_ns: int = 0) -> Outputs | None:
        """The outputs stored under ``key`` (now the most recently used), or None. ``elapsed_ns``: what
        computing the key cost, counted as lookup time."""
        entry = self._entries.get(key)
        self.lookup_ns += elapsed_ns
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry.outputs

    def insert(self, key: bytes, owner: bytes, outputs: Mapping[str, np.ndarray],
               parameters: Mapping[str, object] | None = None) -> Outputs | None:
        """Keep ``outputs`` under ``key``, evicting the least recently used entries until they fit; the
        stored (read-only) outputs, or None when they are larger than the whole cache."""
        stored = Outputs({name: _stored(array) for name, array in outputs.items()}, parameters)
        size = _size(stored)
        if size > self.capacity:
            return None
        previous = self._entries.pop(key, None)
        if previous is not None:
            self.used -= previous.size
        while self.used + size > self.capacity:
            _, evicted = self._entries.popitem(last=False)
            self.used -= evicted.size
            self.evictions += 1
        self._entries[key] = _Entry(stored, size, owner)
        self.used += size
        self.insertions += 1
        return stored

    def record_insertion(self, elapsed_ns: int) -> None:
        self.insertion_ns += elapsed_ns

    def forget(self, owner: bytes) -> int:
        """Drop every entry of one model version (it was unloaded or replaced); how many went."""
        gone = [key for key, entry in self._entries.items() if entry.owner == owner]
        for key in gone:
            self.used -= self._entries.pop(key).size
        return len(gone)

    def gauges(self) -> list[tuple[str, str, float]]:
        return [
            ("nv_cache_util", "Cache utilization [0.0 - 1.0]", self.utilization),
            ("nv_cache_num_entries", "Number of responses stored in response cache", self.entries),
            *lookup_gauges(self.hits, self.misses, self.lookup_ns, self.insertion_ns),
            ("nv_cache_num_evictions", "Number of cache evictions in response cache", self.evictions),
            ("appliance_response_cache_used_bytes", "Bytes the response cache holds", self.used),
            ("appliance_response_cache_size_bytes", "The response cache's size bound (cache_config size)",
             self.capacity),
        ]

    def as_json(self) -> dict[str, float | int]:
        return {"size": self.capacity, "used": self.used, "utilization": round(self.utilization, 6),
                "entries": self.entries, "lookups": self.lookups, "hits": self.hits, "misses": self.misses,
                "evictions": self.evictions, "insertions": self.insertions,
                "lookup_us": self.lookup_ns // 1000, "insertion_us": self.insertion_ns // 1000}


def lookup_gauges(hits: int, misses: int, lookup_ns: int, insertion_ns: int) -> list[tuple[str, str, float]]:
    """Triton's cache gauges that every response cache (this one, Redis) reports alike."""
    return [
        ("nv_cache_num_lookups", "Number of cache lookups in response cache", hits + misses),
        ("nv_cache_num_hits", "Number of cache hits in response cache", hits),
        ("nv_cache_num_misses", "Number of cache misses in response cache", misses),
        ("nv_cache_lookup_duration", "Total cache lookup duration (hit and miss), in microseconds",
         lookup_ns // 1000),
        ("nv_cache_insertion_duration", "Total cache insertion duration, in microseconds", insertion_ns // 1000),
    ]
