"""Triton's ``redis`` response cache: the outputs of models with ``response_cache { enable: true }`` kept on
a Redis server (``--cache-config redis,host=H --cache-config redis,port=P``), shared by every server given the
same key (``cache_redis_key`` or ``cache_redis_key_file``).

Keys are the local cache's digest (appliance.engine.response_cache.request_key) under a hashing key derived
from that secret, and a namespace from the version's content (``ModelVersion.content_digest``: name, config
and files), so two appliances serving the same model with the same key compute the same key and share hits,
and a changed model never answers from its old outputs. They are stored as ``appliance:rc2:<hex>``.

Whoever can write to the Redis server must not answer for a model here. Values are signed
(appliance.engine.redis_entry: an HMAC over the Redis key and the value, never pickle), and one is served
only when its signature holds, it reads back exactly, and its outputs are those the model's config declares
(datatype, rank, fixed dims, the request's batch size first); anything else is a miss, counted as a
failure and logged (once a minute). A read is bounded before it is made: ``STRLEN`` with the first 64 KiB
(``GETRANGE``) in one round trip; a larger entry is read whole only when it is within ``max_entry_size``,
after its bytes are reserved from the request memory budget (``max_request_memory_bytes``, which also
counts what its BYTES elements will take once decoded), and is checked and decoded on a worker thread.

The cache never fails a request: a lookup that errs or takes longer than ``socket_timeout`` is a miss, an
insertion runs after the response in the background (a bounded number at once; the rest are skipped; large
ones are encoded on a worker thread, from a copy of the outputs), a call that finds every pooled connection
busy for ``wait_timeout`` (redis-py's ``BlockingConnectionPool``) goes on without Redis, and after a failure
the server is left alone for a back-off (0.5 s doubling to 30 s) so a Redis that is down costs requests
nothing. Every failure, timeout and skip is counted (``appliance_response_cache_redis_failures``,
``..._skipped``). At start (``check``) only refused credentials stop the daemon, as they stop Triton: they are
a setting to fix, not an outage.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import redis.asyncio as redis
from redis.asyncio.connection import BlockingConnectionPool, Connection, SSLConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, NoPermissionError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from appliance.backends.base import Outputs
from appliance.core.errors import ConfigError, PayloadTooLarge, Unavailable
from appliance.engine.redis_entry import EntryKeys, decode_entry, encode_entry, open_entry
from appliance.engine.response_cache import OutputForms, lookup_gauges, request_key
from appliance.engine.shared_config import RedisCacheConfig
from appliance.engine.types import InferInput

__all__ = ["PREFIX", "Account", "Budget", "RedisResponseCache"]

log = logging.getLogger(__name__)

PREFIX = b"appliance:rc2:"
_INLINE = 64 << 10
"""Entries up to this size are read in one round trip and checked on the loop; larger ones are read once
counted against the memory budget, and checked and decoded (or encoded) on a worker thread."""
_MAX_PENDING_WRITES = 64
_BACKOFF_FIRST, _BACKOFF_MAX = 0.5, 30.0
_WARN_EVERY = 60.0
_BUDGET_SPENT = (Unavailable, PayloadTooLarge)


class Account(Protocol):
    """One read's or write's share of the request memory budget (appliance.security.budget.Account)."""

    def reserve(self, size: int) -> None:
        """Count ``size`` more bytes, or raise Unavailable / PayloadTooLarge counting none of them."""
        ...

    def close(self) -> None: ...


class Budget(Protocol):
    """The request memory budget (appliance.security.budget.MemoryBudget)."""

    def account(self) -> Account: ...


class _Unbounded:
    """No budget: every reservation succeeds (where the cache is used without a daemon)."""

    def account(self) -> _Unbounded:
        return self

    def reserve(self, size: int) -> None:
        pass

    def close(self) -> None:
        pass


def _pool_busy(exc: BaseException) -> bool:
    """BlockingConnectionPool found no free connection within its timeout: it raises a ConnectionError from
    the wait's TimeoutError (a connection that fails raises one from an OSError, or none)."""
    return isinstance(exc, RedisConnectionError) and isinstance(exc.__cause__, TimeoutError)


class RedisResponseCache:
    """The response cache on a Redis server (``cache_config redis,...``); see the module's docstring.
    ``keys``: what signs the entries (default: a key of this process alone); ``budget``: the request memory
    budget that reads and pending writes are counted against."""

    shared = True

    def __init__(self, config: RedisCacheConfig, keys: EntryKeys | None = None, budget: Budget | None = None) -> None:
        self.config = config
        self.keys = keys or EntryKeys.own()
        self._budget: Budget = budget or _Unbounded()
        self._timeout = config.socket_timeout_ms / 1000
        self._connected = False
        """A call has succeeded since the last failure: its connection is up, so socket_timeout alone bounds a
        call; until then a call may also take connect_timeout to connect (and shake hands, with TLS)."""
        self._client: redis.Redis | None = None
        self._writes: set[asyncio.Task[None]] = set()
        self._quiet_until = 0.0
        self._backoff = _BACKOFF_FIRST
        self._warned: dict[str, float] = {}
        """When each kind of warning may be logged again (a writer to Redis must not flood the log)."""
        self.hits = self.misses = self.insertions = 0
        self.failures = 0
        """Lookups and insertions that erred or timed out, and entries refused (unsigned, altered, too large,
        malformed, or not the model's outputs)."""
        self.skipped = 0
        """Lookups and insertions not tried: the server was in its back-off, every connection was busy, too
        many writes were pending, the memory budget was spent, or the response was over max_entry_size."""
        self.lookup_ns = self.insertion_ns = 0

    def _connect(self) -> redis.Redis:
        """The client, made on first use (on the running loop: its connections belong to it)."""
        if self._client is None:
            config = self.config
            tls: dict[str, Any] = {
                "ssl_ca_certs": config.cacert, "ssl_ca_path": config.cacert_dir, "ssl_certfile": config.cert,
                "ssl_keyfile": config.key, "ssl_min_version": ssl.TLSVersion.TLSv1_2} if config.tls else {}
            pool = BlockingConnectionPool(
                max_connections=config.pool_size, timeout=config.wait_timeout_ms / 1000,
                connection_class=SSLConnection if config.tls else Connection,
                host=config.host, port=config.port, db=config.db, username=config.user, password=config.password,
                socket_connect_timeout=config.connect_timeout_ms / 1000, socket_timeout=self._timeout,
                # no retries: a request waits socket_timeout at most, then goes on uncached
                retry=Retry(NoBackoff(), 0), **tls)
            self._client = redis.Redis.from_pool(pool)
        return self._client

    def _bound(self) -> float:
        """How long one call may take: the wait for a connection, then socket_timeout (and connect_timeout
        while not connected)."""
        config = self.config
        bound = config.wait_timeout_ms / 1000 + self._timeout
        return bound if self._connected else bound + config.connect_timeout_ms / 1000

    async def _call(self, what: str, call: Awaitable[Any]) -> Any:
        """``call``'s result, or None when it did not answer: every connection was busy (skipped), the server
        answered with an error (a failure: say, another type of value under the key), or it failed or timed
        out (a failure, and the back-off)."""
        try:
            result = await asyncio.wait_for(call, self._bound())
        except ResponseError as exc:
            self.failures += 1
            self._warn("error", "response cache: redis %s:%d answered %s with an error (%s); served uncached",
                       self.config.host, self.config.port, what, exc)
            return None
        except (RedisError, OSError, TimeoutError) as exc:
            if _pool_busy(exc):  # a busy pool is not a failing server
                self.skipped += 1
            else:
                self._failed(what, exc)
            return None
        self._succeeded()
        return result

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
                "TRITONCACHE_REDIS_PASSWORD), or grant that user STRLEN, GETRANGE and SET on appliance:rc2:*"
            ) from None
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed("the first PING", exc)
        else:
            self._succeeded()
        if not self.keys.shared:
            log.info("response cache: redis entries are signed with this box's own key; give every appliance "
                     "that should share them the same cache_redis_key_file")

    def version_owner(self, identity: bytes | None) -> bytes:
        # Without an identity (an ensemble) the version's entries are its own load's: never stale, not shared.
        return identity if identity is not None else os.urandom(16)

    def key(self, owner: bytes, inputs: Sequence[InferInput], outputs: Iterable[str], parameters: str) -> bytes:
        return PREFIX + request_key(owner, inputs, outputs, parameters, hash_key=self.keys.names).hex().encode()

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

    def _warn(self, kind: str, message: str, *args: object) -> None:
        """Log ``message`` unless a warning of this kind was logged within the last minute (each one is
        counted all the same)."""
        now = time.monotonic()
        if now >= self._warned.get(kind, 0.0):
            self._warned[kind] = now + _WARN_EVERY
            log.warning(message + " (warnings like this one are logged once a minute)", *args)

    def _refused(self, key: bytes, why: str) -> None:
        self.failures += 1
        self.misses += 1
        self._warn("refused", "response cache: entry %s on redis refused: %s; answered from the model",
                   key.decode(), why)

    async def fetch(self, key: bytes, elapsed_ns: int, forms: OutputForms, batch_size: int) -> Outputs | None:
        started = time.perf_counter_ns()
        try:
            if self._resting():
                return None
            outputs = await self._read(key)
            if outputs is None:
                return None
            problem = forms.mismatch(outputs, batch_size)
            if problem is not None:
                self._refused(key, f"it is not the model's answer ({problem})")
                return None
            self.hits += 1
            return outputs
        finally:
            self.lookup_ns += elapsed_ns + time.perf_counter_ns() - started

    async def _read(self, key: bytes) -> Outputs | None:
        """The signed response under ``key``, read within max_entry_size and the memory budget (see the
        module's docstring); None for a miss, counted."""
        client = self._connect()

        async def first() -> list[Any]:
            async with client.pipeline(transaction=False) as pipe:
                pipe.strlen(key)
                pipe.getrange(key, 0, _INLINE - 1)
                return await pipe.execute()

        read = await self._call("a lookup", first())
        if read is None:
            return None
        size, value = read
        if not size:
            self.misses += 1
            return None
        if size > self.config.max_entry_size:
            self._refused(key, f"it holds {size} bytes, over max_entry_size ({self.config.max_entry_size}); not read")
            return None
        account = self._budget.account()
        try:
            account.reserve(size)
            if size > len(value):  # the rest, now that it is counted; at most the size reserved
                value = await self._call("a lookup", client.getrange(key, 0, size - 1))
                if value is None:
                    return None
            if len(value) > _INLINE:
                return await asyncio.to_thread(self._open, key, value, account)
            return self._open(key, value, account)
        except _BUDGET_SPENT:
            self.skipped += 1
            return None
        except Exception as exc:  # whatever the bytes on the server are, they are a miss here
            self._refused(key, str(exc))
            return None
        finally:
            account.close()

    def _open(self, key: bytes, value: bytes, account: Account) -> Outputs:
        return decode_entry(open_entry(key, value, self.keys), account.reserve)

    def store(self, key: bytes, owner: bytes, outputs: Mapping[str, np.ndarray],
              parameters: Mapping[str, object] | None, forms: OutputForms, batch_size: int) -> Outputs | None:
        if self._resting():
            return None
        if len(self._writes) >= _MAX_PENDING_WRITES:
            self.skipped += 1
            return None
        problem = forms.mismatch(outputs, batch_size)
        if problem is not None:  # every other server would refuse the entry: not written
            self.skipped += 1
            self._warn(f"store {forms.model}", "response cache: model %s's responses are not written to redis: %s",
                       forms.model, problem)
            return None
        arrays = {name: np.asarray(array) for name, array in outputs.items()}
        size = sum(array.nbytes for array in arrays.values())
        if size > self.config.max_entry_size:
            self.skipped += 1
            return None
        account = self._budget.account()
        try:
            if size <= _INLINE and not any(array.dtype.hasobject for array in arrays.values()):
                value: bytes | Callable[[], bytes] = encode_entry(key, arrays, parameters, self.keys)
            else:
                # Encoded on a worker thread, from a copy: the runtime may reuse its buffers once answered.
                account.reserve(size)
                copies = {name: array.copy() for name, array in arrays.items()}
                value = functools.partial(encode_entry, key, copies, dict(parameters or {}), self.keys)
        except _BUDGET_SPENT:
            account.close()
            self.skipped += 1
            return None
        task = asyncio.get_running_loop().create_task(self._write(key, value, account))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return None

    async def _write(self, key: bytes, value: bytes | Callable[[], bytes], account: Account) -> None:
        started = time.perf_counter_ns()
        try:
            if callable(value):
                value = await asyncio.to_thread(value)
            if len(value) > self.config.max_entry_size:
                self.skipped += 1
                return
            account.reserve(len(value))
            ttl = self.config.ttl or None
            if await self._call("an insertion", self._connect().set(key, value, ex=ttl)) is not None:
                self.insertions += 1
        except _BUDGET_SPENT:
            self.skipped += 1
        except Exception as exc:  # an output that cannot be encoded: the response was answered all the same
            self.failures += 1
            self._warn("encode", "response cache: a response could not be written to redis (%s)", exc)
        finally:
            account.close()
            self.insertion_ns += time.perf_counter_ns() - started

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
             "and entries refused: unsigned, altered, over max_entry_size, malformed or not the model's "
             "outputs", self.failures),
            ("appliance_response_cache_redis_skipped",
             "Redis lookups and insertions not tried: the server was in its back-off after a failure, every "
             "connection was busy, too many writes were pending, the request memory budget was spent, or "
             "the response was over max_entry_size", self.skipped),
        ]

    def as_json(self) -> dict[str, float | int]:
        return {"lookups": self.lookups, "hits": self.hits, "misses": self.misses,
                "insertions": self.insertions, "failures": self.failures, "skipped": self.skipped,
                "lookup_us": self.lookup_ns // 1000, "insertion_us": self.insertion_ns // 1000}
