"""Triton's rate limiter (``rate_limit = execution_count``): a model instance runs a batch only when the
resources its instance group names are free, and when several instances wait, the one with the fewest
executions weighted by its priority goes first, across every model of the server.

An instance group's ``rate_limiter { resources [{ name, global, count }] priority }`` says what each of its
instances holds while it executes: ``count`` copies of each resource, per device (the instance's GPU, 0 for
a CPU instance) or, with ``global: true``, one pool for the whole box. How many copies exist is the
largest count any loaded instance asks for, unless the server lists them (``rate_limit_resources``:
``NAME:COUNT`` for every device, ``NAME:COUNT:DEVICE`` for one); then every resource a model names must be
listed with enough copies, or the model fails to load with Triton's words. Names match without regard to
case (Triton lowercases the server's list).

Priority is Triton's: an instance's rank is its executions times its priority (0 counts as 1), the lowest
rank runs next, so priority 2 gets half the turns of priority 1 under contention. A waiting instance
blocks those ranked after it even when their resources are free (as Triton's queue does), so a large
request cannot be starved by small ones.

The schedulers hold an instance from their pool first, then its resources (``InstanceLimits``): ``try_take``
on the event loop, else ``take``/``when_free`` to wait in rank order; ``give_back`` when the batch is done,
before the pool lends the instance again. Models register from the loading thread, so the shared tables
sit behind a lock; grants and their callbacks happen on the event loop.

What holds whatever the callers do (docs/rate-limiter.md): an instance holds its resources at most once (a
take while they are still held, before its ``give_back``, waits for that ``give_back`` instead of taking them
twice); the copies held never exceed the copies that exist; every waiter is granted, cancelled, or told its
model was unloaded, never left waiting; a cancelled ``take`` gives back what it was granted meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from appliance.core.errors import ConfigError, Unavailable
from appliance.engine.shared_config import ResourceLimit

__all__ = ["InstanceLimits", "InstanceNeeds", "RateLimitCounts", "RateLimiter", "instance_needs"]

log = logging.getLogger(__name__)

GLOBAL = "global"
"""The scope of a global resource (a device's scope is its number)."""

Scope = str | int
Key = tuple[Scope, str]
"""A resource pool: (scope, lowercased name)."""


@dataclasses.dataclass(frozen=True, slots=True)
class InstanceNeeds:
    """What one instance holds while it executes, from its instance group's ``rate_limiter``."""

    device: int
    resources: tuple[tuple[str, bool, int], ...] = ()
    """(name, global, count) of each resource."""
    priority: int = 1


def instance_needs(config: mc.ModelConfig, count: int) -> list[InstanceNeeds]:
    """One ``InstanceNeeds`` per instance of a model: the instances come group after group, as many as
    each group's ``count``; a GPU group's instances go round its ``gpus``. ``count`` is how many instances
    really run (a group that asked for fewer lends its last group's needs to the rest)."""
    needs: list[InstanceNeeds] = []
    for group in config.instance_group:
        limiter = group.rate_limiter
        resources = tuple((r.name, bool(getattr(r, "global")), r.count) for r in limiter.resources)
        gpus = list(group.gpus) if group.kind == mc.ModelInstanceGroup.KIND_GPU else []
        for index in range(max(group.count, 1)):
            device = gpus[index % len(gpus)] if gpus else 0
            needs.append(InstanceNeeds(device, resources, max(limiter.priority, 1)))
    while len(needs) < count:
        needs.append(needs[-1] if needs else InstanceNeeds(0))
    return needs[:count]


@dataclasses.dataclass(slots=True)
class RateLimitCounts:
    """A model version's instances under the rate limiter (``rate_limiter_stats`` in its statistics, an
    extra member Triton's clients skip)."""

    priority: int = 1
    """The lowest priority value among its instances (the one that runs most often)."""
    executions: int = 0
    waits: int = 0
    """Executions that waited for resources (or for an instance ranked ahead of them)."""
    wait_ns: int = 0


@dataclasses.dataclass(eq=False, slots=True)
class _Slot:
    label: str
    needs: dict[Key, int]
    priority: int
    counts: RateLimitCounts
    executions: int = 0
    held: bool = False
    staged: int | None = None
    """The order it was staged in (ties between equal ranks go to the earlier), None when not waiting."""
    waiting_since: int = 0
    callback: Callable[[], None] | None = None
    abandon: Callable[[BaseException], None] | None = None
    """Tells a waiter its model was unloaded (``take``'s future; ``when_free`` has no way to be told)."""
    removed: bool = False
    """Unregistered: it takes nothing any more."""

    def rank(self) -> int:
        return self.executions * self.priority


class RateLimiter:
    """The server's rate limiter; ``register`` each model version's instances at load."""

    def __init__(self, explicit: Sequence[ResourceLimit] = ()) -> None:
        self._explicit = tuple(explicit)
        self._lock = threading.Lock()
        self._slots: list[_Slot] = []
        self._capacity: dict[Key, int] = {}
        self._used: dict[Key, int] = {}
        self._names: dict[str, str] = {}
        """Lowercased name -> the spelling the first model used (for messages and metrics)."""
        self._staged: list[_Slot] = []
        self._order = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- registration (any thread) -------------------------------------------------------------

    def register(self, label: str, needs: Sequence[InstanceNeeds], counts: RateLimitCounts) -> InstanceLimits:
        """Add one model version's instances; ConfigError (Triton's words) when the resources they name
        cannot all be had, and then nothing is added."""
        slots = []
        for need in needs:
            keys: dict[Key, int] = {}
            for name, is_global, count in need.resources:
                key = (GLOBAL if is_global else need.device, name.lower())
                keys[key] = max(keys.get(key, 0), count)
            slots.append(_Slot(label, keys, need.priority, counts))
        counts.priority = min((s.priority for s in slots), default=1)
        with self._lock:
            for need in needs:
                for name, _, _ in need.resources:
                    self._names.setdefault(name.lower(), name)
            self._slots.extend(slots)
            try:
                self._capacity = self._limits()
            except ConfigError:
                del self._slots[len(self._slots) - len(slots):]
                raise
        self._grant_soon()
        return InstanceLimits(self, slots)

    def unregister(self, slots: Sequence[_Slot]) -> None:
        abandoned = []
        with self._lock:
            for slot in slots:
                if slot.removed:
                    continue
                slot.removed = True
                if slot.held:
                    self._free(slot)
                if slot.staged is not None:
                    self._staged.remove(slot)
                    slot.staged = slot.callback = None
                    if slot.abandon is not None:
                        abandoned.append(slot.abandon)
                slot.abandon = None
                self._slots.remove(slot)
            self._capacity = self._limits()
        for abandon in abandoned:
            abandon(Unavailable(f"model {slots[0].label} was unloaded while waiting for its rate-limiter resources"))
        self._grant_soon()

    def _limits(self) -> dict[Key, int]:
        """Copies of each resource: the most any instance needs, or the server's list (which must cover
        every instance)."""
        needed: dict[Key, int] = {}
        for slot in self._slots:
            for key, count in slot.needs.items():
                needed[key] = max(needed.get(key, 0), count)
        scopes: dict[str, set[bool]] = {}
        for scope, name in needed:
            scopes.setdefault(name, set()).add(scope == GLOBAL)
        for name, kinds in scopes.items():
            if len(kinds) > 1:
                raise ConfigError(f'Resource "{self._names.get(name, name)}" is present as both global and '
                                  "device-specific resource in the model configuration.")
        if not self._explicit:
            return needed
        capacity = {}
        for (scope, name), count in needed.items():
            given = [e.count for e in self._explicit if e.name == name
                     and (scope == GLOBAL or e.device is None or e.device == scope)]
            available = max(given, default=0)
            if available < count:
                raise ConfigError(
                    f'Resource count for "{self._names.get(name, name)}" is limited to {available} which will '
                    "prevent scheduling of one or more model instances, the minimum required count is "
                    f"{count}; raise it in rate_limit_resources ({name}:{count}) or lower the count the "
                    "instance group's rate_limiter asks for")
            capacity[(scope, name)] = available
        return capacity

    # -- allocation (the event loop) -----------------------------------------------------------

    def _fits(self, slot: _Slot) -> bool:
        if slot.held or slot.removed:  # held: its give_back has not come yet; it cannot hold twice
            return False
        return all(self._used.get(key, 0) + count <= self._capacity.get(key, 0)
                   for key, count in slot.needs.items())

    def _hold(self, slot: _Slot) -> None:
        if slot.held:  # _fits refuses a held slot: reaching here is a bug in this module, not its callers'
            raise RuntimeError(f"an instance of {slot.label} would hold its rate-limiter resources twice")
        for key, count in slot.needs.items():
            self._used[key] = self._used.get(key, 0) + count
        slot.held = True

    def _free(self, slot: _Slot) -> None:
        for key, count in slot.needs.items():
            self._used[key] -= count
        slot.held = False

    def _try_take(self, slot: _Slot) -> bool:
        """Hold the slot's resources now; False when they are not free, when an instance ranked ahead of it
        waits, when it waits itself, or when it still holds them (a batch whose give_back has not come):
        then the caller waits (``_stage``), and is granted once that give_back has come."""
        with self._lock:
            if slot.staged is not None or not self._fits(slot):
                return False
            mine = slot.rank()
            if any(other.rank() <= mine for other in self._staged):
                return False
            self._hold(slot)
        return True

    def _stage(self, slot: _Slot, callback: Callable[[], None],
               abandon: Callable[[BaseException], None] | None = None) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if slot.removed:
                raise Unavailable(f"model {slot.label} was unloaded; its instances take no resources")
            if slot.staged is not None:  # one waiter per instance: a second would believe it holds too
                raise RuntimeError(f"an instance of {slot.label} already waits for its rate-limiter resources")
            self._loop = loop
            slot.callback, slot.abandon = callback, abandon
            slot.waiting_since = time.perf_counter_ns()
            slot.staged = next(self._order)
            self._staged.append(slot)
        self._grant()

    def _unstage(self, slot: _Slot) -> bool:
        """Stop waiting; False when the slot was granted meanwhile (it holds its resources). The waiters it
        was ranked ahead of are looked at again: the first may fit now that it no longer waits first."""
        with self._lock:
            if slot.staged is None:
                return False
            self._staged.remove(slot)
            slot.staged = slot.callback = slot.abandon = None
        self._grant()
        return True

    def _give_back(self, slot: _Slot, executed: bool, pending: bool) -> None:
        with self._lock:
            if slot.held:
                self._free(slot)
        if executed:
            slot.executions += 1
            slot.counts.executions += 1
        # As Triton re-stages a released instance whose model has work before it allocates: a waiting
        # instance ranked after this one does not jump ahead of it now (the scheduler takes again next).
        self._grant(behind=slot.rank() if pending else None)
        if pending:
            self._grant_soon()  # in case it does not come back (its requests went away)

    def _grant(self, behind: int | None = None) -> None:
        """Hand resources to the waiting instances in rank order while the first one fits."""
        granted = []
        with self._lock:
            while self._staged:
                top = min(self._staged, key=lambda s: (s.rank(), s.staged))
                if (behind is not None and top.rank() > behind) or not self._fits(top):
                    break
                self._staged.remove(top)
                top.staged = None
                self._hold(top)
                granted.append((top, top.callback))
                top.callback = top.abandon = None
        now = time.perf_counter_ns()
        for slot, callback in granted:
            slot.counts.waits += 1
            slot.counts.wait_ns += now - slot.waiting_since
            if callback is None:
                continue
            try:
                callback()
            except Exception:  # the others granted with it must still hear of it
                log.exception("rate limiter: the grant callback of an instance of %s failed", slot.label)

    def _grant_soon(self) -> None:
        """Grant on the event loop (from a loading thread, or after the current callbacks)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._grant)
        except RuntimeError:  # the loop closed meanwhile
            pass

    # -- what the metrics show -----------------------------------------------------------------

    def resources(self) -> list[dict[str, Any]]:
        """Each resource pool: name, device (or "global"), copies, copies held now."""
        with self._lock:
            return [{"name": self._names.get(name, name), "device": str(scope), "capacity": count,
                     "in_use": self._used.get((scope, name), 0)}
                    for (scope, name), count in sorted(self._capacity.items(), key=lambda item: str(item[0]))]

    @property
    def waiting(self) -> int:
        return len(self._staged)


class InstanceLimits:
    """One model version's instances under the rate limiter, by instance index (held by its pool)."""

    def __init__(self, limiter: RateLimiter, slots: list[_Slot]) -> None:
        self._limiter = limiter
        self._slots = slots
        self._closed = False

    def try_take(self, index: int) -> bool:
        """Hold instance ``index``'s resources now, if they are free and no instance ranked ahead waits."""
        return self._limiter._try_take(self._slots[index])

    def when_free(self, index: int, callback: Callable[[], None]) -> None:
        """Wait in rank order; ``callback()`` runs on the event loop once the resources are held (at once
        if they are free). One waiter per instance; Unavailable once the model is unloaded, and a waiter
        still queued when it is unloaded is dropped (its scheduler is closing)."""
        self._limiter._stage(self._slots[index], callback)

    def cancel(self, index: int) -> bool:
        """Stop waiting (``when_free``); False when the resources were granted already: give them back."""
        return self._limiter._unstage(self._slots[index])

    async def take(self, index: int) -> None:
        """Hold instance ``index``'s resources, waiting in rank order; Unavailable when the model was (or is,
        meanwhile) unloaded. Cancelled, it gives back what it was granted meanwhile."""
        slot = self._slots[index]
        if self._limiter._try_take(slot):
            return
        granted = asyncio.get_running_loop().create_future()

        def grant() -> None:
            if not granted.done():
                granted.set_result(None)

        def abandon(error: BaseException) -> None:
            if not granted.done():
                granted.set_exception(error)

        self._limiter._stage(slot, grant, abandon)
        try:
            await granted
        except BaseException:
            if not self._limiter._unstage(slot) and slot.held:  # granted, but its waiter went away
                self._limiter._give_back(slot, executed=False, pending=False)
            raise

    def give_back(self, index: int, executed: bool = True, pending: bool = False) -> None:
        """The batch on instance ``index`` is done (or was never run: ``executed`` False). ``pending``: its
        model has more work queued, which it will take again at once."""
        self._limiter._give_back(self._slots[index], executed, pending)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._limiter.unregister(self._slots)
