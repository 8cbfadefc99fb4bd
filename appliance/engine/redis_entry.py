"""What the Redis response cache (appliance.engine.redis_cache) writes to and reads from the server, and the
keys that sign it.

Whoever can write to the Redis server must not be able to answer for a model here, so every entry is signed:
``ARC2``, an HMAC-SHA256 tag, then the response: a 4-byte header length, a JSON header (each output's name,
datatype, shape and byte count; the response parameters) and the outputs' bytes. The tag covers the entry's
Redis key and everything after the tag, so an entry copied under another key, altered, cut short or written
by a box without the key is refused before any of it is parsed. Never pickle: nothing read runs code.

The signing key is the operator's (the ``cache_redis_key`` or ``cache_redis_key_file`` setting): every box
given the same one shares the others' entries. Without one, a box signs with a key of its own, kept in
``<state_dir>/response-cache-key`` (created 0600): its entries survive a restart, and it reads no other
box's. The Redis key names are a keyed hash under a key derived from the same secret, so boxes with
different keys do not even look at each other's entries, and no one without the key can tell which request
an entry answers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import logging
import os
import secrets
import struct
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import orjson

from appliance.backends.base import Outputs
from appliance.core.errors import ConfigError
from appliance.core.private_files import check_private_file
from appliance.core.tensors import decode_bytes_tensor, encode_bytes_tensor, numpy_dtype, v2_datatype
from appliance.engine.tensor_checks import BYTES_ELEMENT_OVERHEAD

__all__ = ["MIN_SECRET_LENGTH", "EntryKeys", "decode_entry", "encode_entry", "entry_keys", "open_entry"]

log = logging.getLogger(__name__)

MIN_SECRET_LENGTH = 32
OWN_KEY_FILE = "response-cache-key"
_MAGIC = b"ARC2"
_TAG = 32
_HEADER = struct.Struct("<I")
_START = len(_MAGIC) + _TAG
_MAX_HEADER = 1 << 20


@dataclasses.dataclass(frozen=True, slots=True)
class EntryKeys:
    """The keys derived from one secret: ``names`` keys the hash of a request into its Redis key, ``mac``
    signs the entries. ``shared``: the secret is the operator's (other boxes may hold it), not this box's."""

    names: bytes = dataclasses.field(repr=False)
    mac: bytes = dataclasses.field(repr=False)
    shared: bool = False

    @classmethod
    def of(cls, secret: bytes, shared: bool = False) -> EntryKeys:
        def derive(purpose: bytes) -> bytes:
            return hmac.new(secret, b"edge appliance response cache v2: " + purpose, hashlib.sha256).digest()

        return cls(derive(b"names"), derive(b"entries"), shared)

    @classmethod
    def own(cls) -> EntryKeys:
        """A key of this process alone (nothing written by anyone else is ever read back)."""
        return cls.of(secrets.token_bytes(32))

    def tag(self, key: bytes, body: memoryview | bytes) -> bytes:
        signer = hmac.new(self.mac, len(key).to_bytes(4, "little"), hashlib.sha256)
        signer.update(key)
        signer.update(body)
        return signer.digest()


def entry_keys(secret: str | None, secret_file: Path | None, state_dir: Path,
               note: Callable[[str, str, str], None] | None) -> EntryKeys:
    """The keys for the settings ``cache_redis_key`` / ``cache_redis_key_file``, else this box's own from
    ``<state_dir>/response-cache-key`` (created on first start); one that cannot be saved is kept in memory
    for this run, and ``note`` (the state dir's: kind, message, fix) says so; without ``note``, ConfigError
    (blocking: call off the loop)."""
    if secret is not None:
        return EntryKeys.of(secret.strip().encode(), shared=True)
    if secret_file is not None:
        return EntryKeys.of(_read_secret(secret_file), shared=True)
    path = state_dir / OWN_KEY_FILE
    try:
        return EntryKeys.of(_own_secret(path))
    except OSError as exc:
        problem = exc.strerror or str(exc)
    if note is None:
        raise ConfigError(f"the response cache's key {path} cannot be read or saved ({problem}); make the state "
                          "dir writable, or set cache_redis_key_file")
    note("response_cache_key_not_saved",
         f"the redis response cache's key in {path} cannot be read or saved ({problem}): signing entries with a "
         "key kept in memory, so entries written before a restart are not read after it",
         "make the state dir writable, or set cache_redis_key_file, and restart")
    return EntryKeys.own()


def _read_secret(path: Path) -> bytes:
    missing = "name a file holding the response cache's secret (e.g. made with `head -c 32 /dev/urandom | base64`)"
    check_private_file(path, "cache_redis_key_file", missing=missing,
                       exposed="whoever reads it can answer for every model through Redis")
    try:
        secret = path.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"cache_redis_key_file {path}: {exc.strerror or exc}; {missing}") from None
    if len(secret) < MIN_SECRET_LENGTH:
        raise ConfigError(f"cache_redis_key_file {path} holds {len(secret)} bytes; the secret needs at least "
                          f"{MIN_SECRET_LENGTH} (e.g. `head -c 32 /dev/urandom | base64 > {path}`)")
    return secret


def _own_secret(path: Path) -> bytes:
    """The secret in ``path``, made 0600 on first use: written whole or not at all (a temporary file, then a
    link that fails if another process made the file first)."""
    with contextlib.suppress(FileNotFoundError):
        secret = path.read_bytes().strip()
        if len(secret) >= MIN_SECRET_LENGTH:
            return secret
        log.warning("the response cache's key in %s is too short (a write cut short?); making a new one", path)
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_hex(32).encode()
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(secret + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:  # another process made it first: use that one
            return path.read_bytes().strip()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
    return secret


def encode_entry(key: bytes, outputs: Mapping[str, np.ndarray], parameters: Mapping[str, object] | None,
                 keys: EntryKeys) -> bytes:
    """One response as stored under ``key`` (see the module's docstring)."""
    described, pieces = [], []
    for name, array in outputs.items():
        array = np.asarray(array)
        datatype = v2_datatype(array.dtype)
        raw = encode_bytes_tensor(array) if datatype == "BYTES" else np.ascontiguousarray(array).tobytes()
        described.append([name, datatype, list(array.shape), len(raw)])
        pieces.append(raw)
    header = orjson.dumps({"o": described, "p": dict(parameters or {})})
    body = b"".join([_HEADER.pack(len(header)), header, *pieces])
    return b"".join([_MAGIC, keys.tag(key, body), body])


def open_entry(key: bytes, value: bytes, keys: EntryKeys) -> memoryview:
    """The response in ``value`` once its tag is checked; ValueError for anything not signed for ``key``."""
    if len(value) < _START or value[:len(_MAGIC)] != _MAGIC:
        raise ValueError("not a response cache entry of this version (an older appliance's, or not one at all)")
    body = memoryview(value)[_START:]
    if not hmac.compare_digest(keys.tag(key, body), value[len(_MAGIC):_START]):
        raise ValueError("its signature does not match this box's key: written by a box with another "
                         "cache_redis_key, or altered on the server")
    return body


def decode_entry(body: memoryview | bytes, reserve: Callable[[int], None] | None = None) -> Outputs:
    """The response a signed entry holds (``open_entry``'s result); ValueError for anything malformed.
    ``reserve``: called with what the BYTES elements will cost in memory before they are made."""
    if len(body) < 4:
        raise ValueError("no header")
    (length,) = _HEADER.unpack_from(body, 0)
    if length > min(_MAX_HEADER, len(body) - 4):
        raise ValueError("header length past the entry")
    header = orjson.loads(body[4:4 + length])
    if not isinstance(header, dict) or not isinstance(header.get("o"), list) or not isinstance(header.get("p"), dict):
        raise ValueError("malformed header")
    at, view, outputs = 4 + length, memoryview(body), {}
    for item in header["o"]:
        if not isinstance(item, list) or len(item) != 4:
            raise ValueError("malformed output")
        name, datatype, shape, size = item
        if (not isinstance(name, str) or not isinstance(datatype, str) or not isinstance(size, int)
                or not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
                or size < 0 or at + size > len(view)):
            raise ValueError("malformed output")
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        raw = view[at:at + size]
        if datatype == "BYTES":
            if count > size // 4:  # each element takes at least its 4-byte length
                raise ValueError(f"output {name!r}: {size} bytes cannot hold {count} BYTES elements")
            if reserve is not None:
                reserve(count * BYTES_ELEMENT_OVERHEAD + size)
            array = decode_bytes_tensor(raw, count, name).reshape(shape)
        else:
            dtype = numpy_dtype(datatype)
            if count * dtype.itemsize != size:
                raise ValueError(f"output {name!r}: {size} bytes for {count} {datatype} elements")
            array = np.frombuffer(raw, dtype).reshape(shape)
        array.flags.writeable = False
        outputs[name] = array
        at += size
    if at != len(view):
        raise ValueError("bytes past the last output")
    return Outputs(outputs, header["p"])
