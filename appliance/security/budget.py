"""A global budget of request bytes held in memory, shared by every request of the daemon.

Each request opens an ``Account`` (a context manager) and reserves bytes as it comes to hold them: a
body as it arrives, the decompressed body, the tensors decoded from JSON. Reserving never waits: past
the budget it raises ``Unavailable`` (503, retry shortly), or ``PayloadTooLarge`` when the request alone
needs more than the whole budget (retrying could never help). Leaving the account gives everything
back, whichever way the request ended. Thread-safe: decompression and decoding run on worker threads.
"""

from __future__ import annotations

import threading
from types import TracebackType

from appliance.core.errors import PayloadTooLarge, Unavailable

__all__ = ["Account", "MemoryBudget"]


class MemoryBudget:
    def __init__(self, limit: int, setting: str = "max_request_memory_bytes") -> None:
        if limit < 1:
            raise ValueError(f"a memory budget needs a positive limit, got {limit}")
        self._limit = limit
        self._setting = setting
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        return self._used

    def account(self) -> Account:
        """A new, empty account for one request; use it as a context manager."""
        return Account(self)

    def _refusal(self, held: int, size: int) -> Exception:
        """Why ``size`` more bytes are not counted on an account holding ``held``."""
        if held + size > self._limit:
            return PayloadTooLarge(f"this request needs more than {self._limit} bytes in memory, the whole budget "
                                   f"({self._setting}); send a smaller batch, or raise {self._setting}")
        return Unavailable(f"the server holds {self._used} bytes of requests in memory and {self._setting} is "
                           f"{self._limit}; retry shortly", retry_after=1)


class Account:
    """One request's share of a ``MemoryBudget``; everything it holds is released on exit. Its count is
    kept under the budget's lock (one lock for both, taken once per change)."""

    __slots__ = ("_budget", "_held")

    def __init__(self, budget: MemoryBudget) -> None:
        self._budget = budget
        self._held = 0

    @property
    def held(self) -> int:
        return self._held

    def reserve(self, size: int) -> None:
        """Count ``size`` more bytes against the budget, or raise without counting any of them (both checks
        under the budget's lock: threads may reserve on one account at once, as an ensemble's steps do)."""
        if size <= 0:
            if size < 0:
                raise ValueError(f"cannot reserve a negative size ({size})")
            return
        budget = self._budget
        with budget._lock:
            used = budget._used + size
            if used > budget._limit:  # (what this account holds is part of ``_used``: one test for both)
                raise budget._refusal(self._held, size)
            budget._used = used
            self._held += size

    def release(self, size: int) -> None:
        """Give back up to ``size`` bytes of what this account holds (e.g. a compressed body once it is
        decompressed)."""
        budget = self._budget
        with budget._lock:
            size = min(size, self._held)
            self._held -= size
            budget._used -= size

    def join(self, pieces: list[bytes]) -> bytes:
        """``pieces`` as one bytes object, the list emptied: the pieces and the joined copy coexist for a
        moment, and are counted so."""
        if len(pieces) == 1:
            return pieces.pop()  # bytes.join would return this very object
        total = sum(map(len, pieces))
        self.reserve(total)
        try:
            joined = b"".join(pieces)
            pieces.clear()
        finally:
            self.release(total)
        return joined

    def close(self) -> None:
        """Give back everything this account holds (``release`` of it all, without its call)."""
        if self._held:
            budget = self._budget
            with budget._lock:
                budget._used -= self._held
                self._held = 0

    def __enter__(self) -> Account:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
