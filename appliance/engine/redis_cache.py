"""Triton's ``redis`` response cache: the outputs of models with ``response_cache { enable: true }`` kept on
a Redis server (``--cache-config redis,host=H --cache-config redis,port=P``), shared by every server that
uses it.

Keys are the local cache's digest (appliance.engine.response_cache.request_key) under a fixed hashing key
and a namespace from the version's content (``ModelVersion.content_digest``: name, config and files), so
two appliances serving the same model compute the same key and share hits, and a changed model never
answers from its old outputs. They are stored as ``appliance:rc1:<hex>``.

Values are a small self-describing format, never pickle (whoever can write to the Redis server must not
run code here): ``ARC1``, a 4-byte header length, a JSON header (each output's name, datatype, shape and
byte count; the response parameters), then the outputs' bytes. A value that does not read back exactly
(wrong sizes, unknown datatypes) is a miss, counted as a failure.

The cache never fails a request: a lookup that errs or takes longer than ``socket_timeout`` is a miss, an
insertion runs after the response in the background (a bounded number at once; the rest are skipped), a
call that finds every pooled connection busy for ``wait_timeout`` goes on without Redis,
and after a failure the server is left alone for a back-off (0.5 s doubling to 30 s) so a Redis that is
down costs requests nothing. Every failure, timeout and skip is counted
(``appliance_response_cache_redis_failures``, ``..._skipped``). At start (``check``) only refused credentials
stop the daemon, as they stop Triton: they are a setting to fix, not an outage.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import struct
import time
from collections.abc import Iterable, Mapping, Sequence

import blake3
import numpy as np
import orjson
import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, NoPermissionError, RedisError

from appliance.backends.base import Outputs
from appliance.core.errors import ConfigError
from appliance.core.tensors import decode_bytes_tensor, encode_bytes_tensor, numpy_dtype, v2_datatype
from appliance.engine.response_cache import lookup_gauges, request_key
from appliance.engine.shared_config import RedisCacheConfig
from appliance.engine.types import InferInput

__all__ = ["RedisResponseCache", "decode_entry", "encode_entry"]

log = logging.getLogger(__name__)

PREFIX = b"appliance:rc1:"
_HASH_KEY = blake3.blake3(b"edge appliance response cache, shared keys, v1").digest()
"""Fixed, so that every server derives the same key for the same request (unlike the local cache's)."""
_MAGIC = b"ARC1"
_HEADER = struct.Struct("<I")
_MAX_HEADER = 1 << 20
_MAX_PENDING_WRITES = 64
_BACKOFF_FIRST, _BACKOFF_MAX = 0.5, 30.0


def encode_entry(outputs: Mapping[str, np.ndarray], parameters: Mapping[str, object] | None) -> bytes:
    """One response as stored on the server (see the module's docstring)."""
    described, pieces = [], []
    for name, array in outputs.items():
        array = np.asarray(array)
        datatype = v2_datatype(array.dtype)
        raw = encode_bytes_tensor(array) if datatype == "BYTES" else np.ascontiguousarray(array).tobytes()
        described.append([name, datatype, list(array.shape), len(raw)])
        pieces.append(raw)
    header = orjson.dumps({"o": described, "p": dict(parameters or {})})
    return b"".join([_MAGIC, _HEADER.pack(len(header)), header, *pieces])


def decode_entry(value: bytes) -> Outputs:
    """The response ``encode_entry`` stored; ValueError for anything else."""
    if len(value) < 8 or value[:4] != _MAGIC:
        raise ValueError("not a response cache entry")
    (length,) = _HEADER.unpack_from(value, 4)
    if length > min(_MAX_HEADER, len(value) - 8):
        raise ValueError("header length past the entry")
    header = orjson.loads(value[8:8 + length])
    if not isinstance(header, dict) or not isinstance(header.get("o"), list) or not isinstance(header.get("p"), dict):
        raise ValueError("malformed header")
    at, view, outputs = 8 + length, memoryview(value), {}
    for item in header["o"]:
        name, datatype, shape, size = item
        if (not isinstance(name, str) or not isinstance(datatype, str) or not isinstance(size, int)
                or not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
                or size < 0 or at + size > len(value)):
            raise ValueError("malformed output")
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        raw = view[at:at + size]
        if datatype == "BYTES":
            if count > size // 4:  # each element takes at least its 4-byte length
                raise ValueError(f"output {name!r}: {size} bytes cannot hold {count} BYTES elements")
            array = decode_bytes_tensor(raw, count, name).reshape(shape)
        else:
            dtype = numpy_dtype(datatype)
            if count * dtype.itemsize != size:
                raise ValueError(f"output {name!r}: {size} bytes for {count} {datatype} elements")
            array = np.frombuffer(raw, dtype).reshape(shape)
        array.flags.writeable = False
        outputs[name] = array
        at += size
    if at != len(value):
        raise ValueError("bytes past the last output")
    return Outputs(outputs, header["p"])


class RedisResponseCache:
    """The response cache on a Redis server (``cache_config redis,...``); see the module's docstring."""

    shared = True

    def __init__(self, config: RedisCacheConfig) -> None:
        self.config = config
        self._timeout = config.socket_timeout_ms / 1000
        self._connected = False
        """A call has succeeded since the last failure: its connection is up, so socket_timeout alone bounds a
        call; until then a call may also take connect_timeout to connect (and shake hands, with TLS)."""
        self._client: redis.Redis | None = None
        self._slots: asyncio.Semaphore | None = None
        """One per pooled connection: a call waits wait_timeout for one, then goes on without Redis."""
        self._writes: set[asyncio.Task[None]] = set()
        self._quiet_until = 0.0
        self._backoff = _BACKOFF_FIRST
        self.hits = self.misses = self.insertions = 0
        self.failures = 0
        """Lookups and insertions that erred or timed out, and entries that did not read back."""
        self.skipped = 0
        """Lookups and insertions not tried: the server was in its back-off, or too many writes were pending."""
        self.lookup_ns = self.insertion_ns = 0

    def _connect(self) -> redis.Redis:
        """The client, made on first use (on the running loop: its connections belong to it)."""
        if self._client is None:
            config = self.config
            tls = {"ssl": True, "ssl_ca_certs": config.cacert, "ssl_ca_path": config.cacert_dir,
                   "ssl_certfile": config.cert, "ssl_keyfile": config.key,
                   "ssl_min_version": ssl.TLSVersion.TLSv1_2} if config.tls else {}
            self._client = redis.Redis(
                host=config.host, port=config.port, db=config.db, username=config.user, password=config.password,
                socket_connect_timeout=config.connect_timeout_ms / 1000, socket_timeout=self._timeout,
                # no retries: a request waits socket_timeout at most, then goes on uncached
                max_connections=config.pool_size, retry=Retry(NoBackoff(), 0), **tls)  # type: ignore[arg-type]
            self._slots = asyncio.Semaphore(config.pool_size)
        return self._client

    async def _slot(self) -> bool:
        """A connection of the pool is ours (release ``_slots`` after), or none came within wait_timeout
        (counted as skipped: a busy pool is not a failing server)."""
        self._connect()
        assert self._slots is not None
        try:
            await asyncio.wait_for(self._slots.acquire(), self.config.wait_timeout_ms / 1000)
        except TimeoutError:
            self.skipped += 1
            return False
        return True

    def _bound(self) -> float:
        return self._timeout if self._connected else self._timeout + self.config.connect_timeout_ms / 1000

    async def check(self) -> None:
        """At start: a Redis that refuses the credentials stops the daemon (ConfigError, as Triton's redis cache
        refuses to start); one that is down or slow is only logged, and requests go uncached until it answers."""
        config = self.config
        bound = (config.connect_timeout_ms + config.socket_timeout_ms) / 1000
        try:
            await asyncio.wait_for(self._connect().ping(), bound)
        except (AuthenticationError, NoPermissionError) as exc:
            raise ConfigError(
                f"cache_config: redis {config.host}:{config.port} refused the cache's credentials ({exc}); give the "
                "right redis,user=<user> and redis,password=<password> (or TRITONCACHE_REDIS_USERNAME and "
                "TRITONCACHE_REDIS_PASSWORD), or grant that user GET and SET on appliance:rc1:*") from None
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed("the first PING", exc)
        else:
            self._succeeded()

    def version_owner(self, identity: bytes | None) -> bytes:
        # Without an identity (an ensemble) the version's entries are its own load's: never stale, not shared.
        return identity if identity is not None else os.urandom(16)

    def key(self, owner: bytes, inputs: Sequence[InferInput], outputs: Iterable[str], parameters: str) -> bytes:
        return PREFIX + request_key(owner, inputs, outputs, parameters, hash_key=_HASH_KEY).hex().encode()

    def _resting(self) -> bool:
        if time.monotonic() < self._quiet_until:
            self.skipped += 1
            return True
        return False

    def _failed(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        self._connected = False
        if self._quiet_until == 0.0:  # once per outage
            log.warning("response cache: %s on redis %s:%d failed (%s); requests are served uncached, and the "
                        "server is tried again after a back-off", what, self.config.host, self.config.port,
                        "timed out" if isinstance(exc, TimeoutError) else exc)
        self._quiet_until = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, _BACKOFF_MAX)

    def _succeeded(self) -> None:
        if self._quiet_until:
            log.warning("response cache: redis %s:%d answers again", self.config.host, self.config.port)
        self._quiet_until, self._backoff, self._connected = 0.0, _BACKOFF_FIRST, True

    async def fetch(self, key: bytes, elapsed_ns: int) -> Outputs | None:
        started = time.perf_counter_ns()
        try:
            if self._resting() or not await self._slot():
                return None
            try:
                value = await asyncio.wait_for(self._connect().get(key), self._bound())
            except (RedisError, OSError, TimeoutError) as exc:
                self._failed("a lookup", exc)
                return None
            finally:
                assert self._slots is not None
                self._slots.release()
            self._succeeded()
            if value is None:
                self.misses += 1
                return None
            try:
                outputs = decode_entry(value if isinstance(value, bytes) else value.encode())
            except Exception as exc:  # whatever the bytes on the server are, they are a miss here
                self.failures += 1
                log.warning("response cache: entry %s on redis does not read back (%s); answered from the model",
                            key.decode(), exc)
                return None
            self.hits += 1
            return outputs
        finally:
            self.lookup_ns += elapsed_ns + time.perf_counter_ns() - started

    def store(self, key: bytes, owner: bytes, outputs: Mapping[str, np.ndarray],
              parameters: Mapping[str, object] | None) -> Outputs | None:
        if self._resting():
            return None
        if len(self._writes) >= _MAX_PENDING_WRITES:
            self.skipped += 1
            return None
        value = encode_entry(outputs, parameters)
        if len(value) > self.config.max_entry_size:
            self.skipped += 1
            return None
        task = asyncio.get_running_loop().create_task(self._write(key, value))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return None

    async def _write(self, key: bytes, value: bytes) -> None:
        if not await self._slot():
            return
        started = time.perf_counter_ns()
        try:
            ttl = self.config.ttl or None
            await asyncio.wait_for(self._connect().set(key, value, ex=ttl), self._bound())
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed("an insertion", exc)
            return
        finally:
            assert self._slots is not None
            self._slots.release()
            self.insertion_ns += time.perf_counter_ns() - started
        self._succeeded()
        self.insertions += 1

    def record_insertion(self, elapsed_ns: int) -> None:
        """Encoding and handing the write on is counted here; the write itself in ``_write``."""
        self.insertion_ns += elapsed_ns

    def forget(self, owner: bytes) -> int:
        return 0  # entries are keyed by content and shared: they stay until their ttl or Redis's eviction

    async def close(self) -> None:
        """Finish the writes under way (bounded by the timeout), then close the connections."""
        if self._writes:
            await asyncio.wait(list(self._writes), timeout=self._timeout * 2)
            for task in list(self._writes):
                task.cancel()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    @property
    def lookups(self) -> int:
        return self.hits + self.misses

    def gauges(self) -> list[tuple[str, str, float]]:
        return [
            *lookup_gauges(self.hits, self.misses, self.lookup_ns, self.insertion_ns),
            ("appliance_response_cache_insertions", "Responses written to the Redis response cache",
             self.insertions),
            ("appliance_response_cache_redis_failures",
             "Redis lookups and insertions that failed or timed out (each request was served uncached), "
             "and entries that did not read back", self.failures),
            ("appliance_response_cache_redis_skipped",
             "Redis lookups and insertions not tried: the server was in its back-off after a failure, too "
             "many writes were pending, or the response was over max_entry_size", self.skipped),
        ]

    def as_json(self) -> dict[str, float | int]:
        return {"lookups": self.lookups, "hits": self.hits, "misses": self.misses,
                "insertions": self.insertions, "failures": self.failures, "skipped": self.skipped,
                "lookup_us": self.lookup_ns // 1000, "insertion_us": self.insertion_ns // 1000}
