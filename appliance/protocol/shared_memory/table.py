"""The registered regions of both kinds, by name: who may use them, how many, and who holds them.

A region is held open (its file descriptor, or its opened CUDA IPC handle) while it is registered
*or* leased. A request leases every region it names, input or output, for as long as it runs. A
region unregistered while leased stays in the table, listed by status and usable by requests, as
Triton keeps it (its name cannot be registered again meanwhile); it leaves the table and is closed
when the last lease is given back, so a request never reads or writes through a closed descriptor
(or one the kernel has handed to another file).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

from appliance.core.errors import AlreadyExists, Forbidden, InvalidInput, RegionNotFound

__all__ = ["CLIENT_SHM_MODES", "Lease", "Region", "RegionKind", "RegionTable", "SharedMemoryLimits",
           "check_region_name"]

log = logging.getLogger(__name__)

CLIENT_SHM_MODES = ("off", "local", "any")
_MAX_NAME = 255


class Region(Protocol):
    """One opened region: ``byte_size`` bytes, addressed from 0."""

    kind: str
    """"system" or "cuda"."""
    byte_size: int

    def read(self, offset: int, out: memoryview) -> None:
        """Fill ``out`` (bytes, format 'B') from ``offset``; the caller has checked the bounds."""

    def write(self, offset: int, data: memoryview) -> None:
        """Copy ``data`` (bytes, format 'B') in at ``offset``; the caller has checked the bounds."""

    def status(self) -> dict[str, Any]:
        """Triton's status fields beyond the name."""

    def close(self) -> None:
        """Give the region back (close the descriptor, the IPC handle); called once."""


@dataclasses.dataclass(frozen=True, slots=True)
class SharedMemoryLimits:
    max_regions: int = 64
    """Regions registered (or still leased after unregistering) at once, both kinds together."""
    max_bytes: int = 2 << 30
    """Bytes of all those regions together."""


class _Entry:
    __slots__ = ("name", "region", "leases", "retired")

    def __init__(self, name: str, region: Region) -> None:
        self.name, self.region, self.leases, self.retired = name, region, 0, False


class Lease:
    """A region held by one request; ``release`` (or leaving the ``with`` block) gives it back."""

    __slots__ = ("name", "region", "_table", "_entry")

    def __init__(self, table: RegionTable, entry: _Entry) -> None:
        self.name, self.region = entry.name, entry.region
        self._table = table
        self._entry: _Entry | None = entry

    def clone(self) -> Lease:
        """A second lease on the same region, for a copy that may outlive this lease's holder."""
        if self._entry is None:
            raise RuntimeError(f"the lease on shared memory region '{self.name}' was given back already")
        return self._table._hold(self._entry)

    def release(self) -> None:
        entry, self._entry = self._entry, None
        if entry is not None:
            self._table._release(entry)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def check_region_name(name: object) -> str:
    """A name to register a region under; refused in Triton's words for a register's bad arguments."""
    if not isinstance(name, str) or not 0 < len(name) <= _MAX_NAME or not name.isprintable():
        raise InvalidInput(
            f"failed to register shared memory region {str(name)[:60]!r}: invalid args: a shared memory region "
            f"name must be 1 to {_MAX_NAME} printable characters"
        )
    return name


def check_register_integer(value: object, what: str, region: str, low: int) -> int:
    """A register's offset, byte size or device id: an integer from ``low`` to 2**63 - 1 (Triton's "invalid
    args", then which)."""
    if type(value) is not int or not low <= value < (1 << 63):
        raise InvalidInput(
            f"failed to register shared memory region '{region}': invalid args: '{what}' must be an integer of at "
            f"least {low}, got {str(value)[:40]!r}"
        )
    return value


class RegionTable:
    """Thread-safe: front ends call it on the event loop, copies run on worker threads."""

    def __init__(self, client_shm: str, limits: SharedMemoryLimits) -> None:
        if client_shm not in CLIENT_SHM_MODES:
            raise ValueError(f"client_shm must be one of {CLIENT_SHM_MODES}, got {client_shm!r}")
        self.client_shm = client_shm
        self.limits = limits
        self._entries: dict[str, _Entry] = {}
        self._open: set[_Entry] = set()  # registered or still leased: what the limits count
        self._pending: dict[str, int] = {}  # names being opened now, with their sizes
        self._closed = False
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.client_shm != "off"

    def check_client(self, local: bool) -> None:
        """Refuse a client the ``client_shm`` setting does not let use shared memory."""
        if self.client_shm == "off":
            raise Forbidden(
                "Client shared memory is disabled on this appliance (client_shm = off); set client_shm = local "
                "to let clients on this host use it"
            )
        if self.client_shm == "local" and not local:
            raise Forbidden(
                "shared memory is only for clients on this host (client_shm = local) and this request came "
                "from another address; run the client on the appliance and connect to it from there, or "
                "set client_shm = any"
            )

    def check_status_client(self, local: bool) -> None:
        """Status asks less: with client shared memory off it answers (nothing is registered), as Triton
        does with client shared memory disabled; otherwise as ``check_client``."""
        if self.client_shm != "off":
            self.check_client(local)

    def add(self, name: str, byte_size: int, open_region: Callable[[], Region]) -> None:
        """Register ``name``: check the name and the limits, then open the region (outside the lock:
        opening may take a while), then enter it."""
        with self._lock:
            self._check_free(name)
            count = len(self._open) + len(self._pending)
            used = sum(e.region.byte_size for e in self._open) + sum(self._pending.values())
            if count >= self.limits.max_regions:
                raise InvalidInput(
                    f"failed to register shared memory region '{name}': {count} regions are registered already "
                    f"(shm_max_regions = {self.limits.max_regions}); unregister regions you no longer use, or "
                    "raise shm_max_regions"
                )
            if used + byte_size > self.limits.max_bytes:
                raise InvalidInput(
                    f"failed to register shared memory region '{name}': {byte_size} more bytes would make "
                    f"{used + byte_size}, over shm_max_bytes ({self.limits.max_bytes}); unregister regions you "
                    "no longer use, register a smaller one, or raise shm_max_bytes"
                )
            self._pending[name] = byte_size
        try:
            region = open_region()
        except BaseException:
            with self._lock:
                del self._pending[name]
            raise
        with self._lock:
            del self._pending[name]
            if self._closed:
                region.close()
                raise self._stopping()
            entry = _Entry(name, region)
            self._entries[name] = entry
            self._open.add(entry)

    def _check_free(self, name: str) -> None:
        if self._closed:
            raise self._stopping()
        if name in self._entries or name in self._pending:
            raise AlreadyExists(
                f"shared memory region '{name}' already in manager; unregister it first or choose another name"
            )

    @staticmethod
    def _stopping() -> InvalidInput:
        return InvalidInput("the appliance is stopping; shared memory regions cannot be registered now")

    def lease(self, name: str) -> Lease:
        """Hold the region ``name`` (one awaiting its unregister too, as Triton lets requests use it)."""
        with self._lock:
            entry = self._entries.get(name)
            if entry is None:
                raise RegionNotFound(f"Unable to find shared memory region: '{name}'")
            entry.leases += 1  # under the lock that retiring takes: never a lease on a closed region
        return Lease(self, entry)

    def _hold(self, entry: _Entry) -> Lease:
        """One more lease on an entry that is leased already (so still open)."""
        with self._lock:
            entry.leases += 1
        return Lease(self, entry)

    def _release(self, entry: _Entry) -> None:
        with self._lock:
            entry.leases -= 1
            closing = entry.retired and entry.leases == 0
            if closing:
                self._open.discard(entry)
                if self._entries.get(entry.name) is entry:  # unregistered meanwhile: it leaves the table now
                    del self._entries[entry.name]
        if closing:
            self._close(entry)

    def find(self, kind: str, name: str | None) -> list[tuple[str, Region]]:
        """Registered regions of ``kind`` (all, or the one named: RegionNotFound if it is not one)."""
        with self._lock:
            if name is None:
                return [(e.name, e.region) for e in self._entries.values() if e.region.kind == kind]
            entry = self._entries.get(name)
        label = "system" if kind == "system" else "cuda"
        if entry is None:
            raise RegionNotFound(f"Unable to find {label} shared memory region: '{name}'")
        if entry.region.kind != kind:
            other = "CUDA" if entry.region.kind == "cuda" else "system"
            raise RegionNotFound(
                f"The region named '{name}' is registered as {other} shared memory, not {label} shared memory"
            )
        return [(entry.name, entry.region)]

    def remove(self, kind: str, name: str | None = None) -> None:
        """Unregister one region of ``kind`` (an unknown name is not an error, as in Triton), or every one."""
        with self._lock:
            names = [n for n, e in self._entries.items() if e.region.kind == kind and (name is None or n == name)]
            closing = [self._retire(n) for n in names]
        for entry in closing:
            if entry is not None:
                self._close(entry)

    def _retire(self, name: str) -> _Entry | None:
        """Unregister ``name`` (lock held): out of the table and the entry returned to be closed now, or,
        while requests hold it, marked to leave the table when the last of them is done (Triton's
        "will be unregistered after in-flight requests complete")."""
        entry = self._entries[name]
        if entry.leases:
            if not entry.retired:
                log.info("shared memory region '%s' will be unregistered after in-flight requests complete", name)
            entry.retired = True
            return None
        entry.retired = True
        del self._entries[name]
        self._open.discard(entry)
        return entry

    def close(self) -> None:
        """Unregister everything and refuse new registrations; regions still leased close on release."""
        with self._lock:
            self._closed = True
            closing = [self._retire(n) for n in list(self._entries)]
        for entry in closing:
            if entry is not None:
                self._close(entry)

    @staticmethod
    def _close(entry: _Entry) -> None:
        try:
            entry.region.close()
        except Exception as exc:  # noqa: BLE001 - one region that fails to close must not stop the rest
            log.error("closing shared memory region '%s' failed: %s: %s", entry.name, type(exc).__name__, exc)

    def counts(self) -> tuple[int, int]:
        """(regions held open, their bytes), registered or still leased."""
        with self._lock:
            return len(self._open), sum(e.region.byte_size for e in self._open)


class RegionKind:
    """One kind's API over the shared table (system or CUDA, ``kind``), free of any transport: what status
    and unregister do alike. ``local``: whether the client is on this host, as the front end sees it."""

    kind: ClassVar[str]

    def __init__(self, table: RegionTable) -> None:
        self._table = table

    def status(self, name: str | None = None, *, local: bool) -> list[dict[str, Any]]:
        self._table.check_status_client(local)
        return [{"name": n, **r.status()} for n, r in self._table.find(self.kind, name)]

    def unregister(self, name: str | None = None, *, local: bool) -> None:
        """One region, or every region of this kind when ``name`` is None; an unknown name is not an error."""
        self._table.check_client(local)
        self._table.remove(self.kind, name)
