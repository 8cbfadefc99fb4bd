"""Which box gets the next request: the routing state and policy shared by BoxPool and AsyncBoxPool.

A box is a candidate for a model when it serves the protocol, has the model READY (from its repository
index) and is not cooling down. Among the candidates, two are drawn at random and the one with the lower
expected wait wins ("power of two choices", Mitzenmacher): (requests outstanding + 1) x its latency
estimate, an exponentially weighted average of its recent successful requests (Finagle's and
Linkerd's peak-EWMA idea) that decays while no request refreshes it, so that a box passed over (its
one slow, cold first call, say) is tried again within seconds rather than never. Two random draws keep
many clients from herding onto the same "best" box while still steering away from slow or busy ones.

Cooling down: a box that cannot be reached is left alone for ``cooldown`` seconds; one that answers
503 (full, or stopping) for its Retry-After, at most ``busy_backoff`` seconds (it is busy now, not
gone). Thread-safe: every method takes one lock, none blocks.
"""

from __future__ import annotations

import dataclasses
import math
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable

from appliance.client.boxes import Box

__all__ = ["BoxState", "NoBoxAvailable", "Router"]


class NoBoxAvailable(RuntimeError):
    """No box could take the request: none has the model READY, or all failed or stayed busy until the
    retry deadline."""

_ALPHA = 0.1
"""Weight of the newest latency sample in the estimate."""
_DECAY = 5.0
"""Seconds over which a latency estimate no request refreshes falls by a factor e."""
_TIE = 0.1
"""Costs closer than this fraction are a tie, broken at random."""


@dataclasses.dataclass
class BoxState:
    box: Box
    outstanding: int = 0
    latency: float | None = None
    """Seconds, the weighted average of recent successful requests (None: none yet), as of ``sampled_at``."""
    sampled_at: float = 0.0
    down_until: float = 0.0
    models: frozenset[str] | None = None
    """Names of the models READY on the box (None: its index has not been read yet)."""
    index_error: str | None = None
    """Why its index could not be read the last time (None: it was)."""
    served: dict[str, int] = dataclasses.field(default_factory=dict)
    """Requests answered, per model."""
    refused: int = 0
    """503 answers (retried on another box)."""
    unreachable: int = 0
    """Connection failures (retried on another box)."""
    failed: int = 0
    """Errors raised to the caller (the request reached the box and failed there)."""

    def as_json(self) -> dict:
        return {"url": self.box.base_url, "outstanding": self.outstanding,
                "latency_ms": None if self.latency is None else round(self.latency * 1000, 3),
                "models": sorted(self.models) if self.models is not None else None,
                "served": dict(self.served), "refused": self.refused, "unreachable": self.unreachable,
                "failed": self.failed, "index_error": self.index_error}


def _estimate(state: BoxState, now: float) -> float | None:
    """The box's latency estimate, decayed for the time since a request last refreshed it."""
    if state.latency is None:
        return None
    return state.latency * math.exp(-max(0.0, now - state.sampled_at) / _DECAY)


MAX_PINNED = 65536
"""Sequences remembered at once (the least recently used are forgotten first)."""


class Router:
    def __init__(self, cooldown: float = 30.0, busy_backoff: float = 0.25, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cooldown = cooldown
        self.busy_backoff = busy_backoff
        self._rng = rng or random.Random()
        self._clock = clock
        self._boxes: dict[str, BoxState] = {}
        self._lock = threading.Lock()
        # Sequence -> the box holding its state: every step of a stateful stream must reach the same box.
        self._pinned: OrderedDict[Hashable, str] = OrderedDict()

    # -- the set of boxes -------------------------------------------------------------------------
    def add(self, box: Box) -> bool:
        """Add a box or update its record; True when its ready models must be read (new, or its
        record's model digest or addresses changed)."""
        with self._lock:
            state = self._boxes.get(box.name)
            if state is None:
                self._boxes[box.name] = BoxState(box)
                return True
            stale = (state.box.catalog != box.catalog or state.box.models != box.models
                     or state.box.url != box.url or state.models is None)
            if state.box.url != box.url:  # moved: what was known of the old address no longer holds
                state.latency, state.down_until = None, 0.0
            state.box = box
            return stale

    def remove(self, name: str) -> None:
        with self._lock:
            self._boxes.pop(name, None)

    def set_models(self, name: str, models: Iterable[str] | None) -> None:
        with self._lock:
            state = self._boxes.get(name)
            if state is not None:
                state.models = None if models is None else frozenset(models)
                state.index_error = None

    def index_failed(self, name: str, error: str) -> None:
        """The box's index could not be read: what was known of its models stays."""
        with self._lock:
            state = self._boxes.get(name)
            if state is not None:
                state.index_error = error

    def boxes(self) -> list[Box]:
        with self._lock:
            return [s.box for s in self._boxes.values()]

    def healthy(self) -> list[Box]:
        now = self._clock()
        with self._lock:
            return sorted((s.box for s in self._boxes.values() if s.down_until <= now), key=lambda b: b.name)

    def snapshot(self) -> dict[str, dict]:
        with self._lock:
            return {name: state.as_json() for name, state in sorted(self._boxes.items())}

    # -- choosing ---------------------------------------------------------------------------------
    def _holders(self, model: str, protocol: str) -> list[BoxState]:
        return [s for s in self._boxes.values()
                if s.models is not None and model in s.models and s.box.url_for(protocol) is not None]

    def choose(self, model: str, protocol: str, exclude: set[str], sequence: Hashable | None = None) -> Box | None:
        """The box for the next request (counted outstanding until ``finished``); None when no box that
        has the model READY is free to take it now. A request of a ``sequence`` goes to the box its
        sequence started on while that box can take it (elsewhere the sequence's state is unknown: that
        box answers that the sequence needs START, which the caller sees)."""
        now = self._clock()
        with self._lock:
            candidates = [s for s in self._holders(model, protocol)
                          if s.down_until <= now and s.box.name not in exclude]
            if not candidates:
                return None
            pinned = self._pinned.get(sequence) if sequence is not None else None
            held = [s for s in candidates if s.box.name == pinned]
            if held:
                candidates = held
            if len(candidates) == 1:
                chosen = candidates[0]
            else:
                known = [latency for s in candidates if (latency := _estimate(s, now)) is not None]
                default = sum(known) / len(known) if known else 1.0

                def cost(state: BoxState) -> float:
                    latency = _estimate(state, now)
                    return (state.outstanding + 1) * (latency if latency is not None else default)

                first, second = self._rng.sample(candidates, 2)
                one, other = cost(first), cost(second)
                if abs(one - other) <= _TIE * max(one, other):  # as good as each other: keep spreading
                    chosen = self._rng.choice((first, second))
                else:
                    chosen = first if one < other else second
            chosen.outstanding += 1
            if sequence is not None:
                self._pin(sequence, chosen.box.name)
            return chosen.box

    def _pin(self, sequence: Hashable, name: str) -> None:
        self._pinned[sequence] = name
        self._pinned.move_to_end(sequence)
        while len(self._pinned) > MAX_PINNED:  # abandoned sequences: the servers reap them too
            self._pinned.popitem(last=False)

    def unpin(self, sequence: Hashable) -> None:
        """The sequence ended: its next START may go anywhere."""
        with self._lock:
            self._pinned.pop(sequence, None)

    def next_free(self, model: str, protocol: str) -> float | None:
        """Seconds until a box with the model stops cooling down (0: one is free now); None: no box
        has the model READY."""
        now = self._clock()
        with self._lock:
            holders = self._holders(model, protocol)
            if not holders:
                return None
            return max(0.0, min(s.down_until for s in holders) - now)

    def unread(self) -> bool:
        """Whether some box's ready models are not known yet (just found; not one whose index failed)."""
        with self._lock:
            return any(s.models is None and s.index_error is None for s in self._boxes.values())

    def _index_errors(self) -> str:
        with self._lock:
            errors = [f"{n}: {s.index_error}" for n, s in sorted(self._boxes.items()) if s.index_error]
        return f"; models unknown on {'; '.join(errors)}" if errors else ""

    def pause(self, model: str, protocol: str, tried: set[str], remaining: float, last: Exception | None) -> float:
        """No box is free for this request now: how long to wait before choosing again (``tried`` is
        cleared when every box with the model has been tried, so that they are tried again), or
        NoBoxAvailable when waiting cannot help."""
        free_in = self.next_free(model, protocol)
        if free_in is None:
            if not self.unread() and self.boxes():
                names = ", ".join(sorted(b.name for b in self.boxes()))
                raise NoBoxAvailable(f"no box has model {model!r} READY over {protocol} (boxes: {names}); load it "
                                     f"on one (appliance push) or check the name{self._index_errors()}")
            free_in = 0.05  # boxes are still being found or read: look again shortly
        elif tried:
            tried.clear()
            free_in = max(free_in, 0.05)
        if free_in >= remaining:
            detail = f"; last error: {last}" if last is not None else ""
            raise NoBoxAvailable(f"no box could serve model {model!r} within the retry deadline{detail}")
        return free_in

    # -- outcomes ---------------------------------------------------------------------------------
    def _finish(self, name: str) -> BoxState | None:
        state = self._boxes.get(name)
        if state is not None:
            state.outstanding = max(0, state.outstanding - 1)
        return state

    def succeeded(self, name: str, model: str, seconds: float) -> None:
        now = self._clock()
        with self._lock:
            state = self._finish(name)
            if state is not None:
                current = _estimate(state, now)
                state.latency = seconds if current is None else (1 - _ALPHA) * current + _ALPHA * seconds
                state.sampled_at = now
                state.served[model] = state.served.get(model, 0) + 1

    def failed(self, name: str) -> None:
        """The box answered the request with an error the caller gets (not retried)."""
        with self._lock:
            state = self._finish(name)
            if state is not None:
                state.failed += 1

    def refused(self, name: str, retry_after: float | None) -> None:
        """503: full or stopping; left alone for its Retry-After (at most busy_backoff)."""
        with self._lock:
            state = self._finish(name)
            if state is not None:
                state.refused += 1
                pause = self.busy_backoff if retry_after is None else min(retry_after, self.busy_backoff)
                state.down_until = max(state.down_until, self._clock() + pause)

    def unreachable(self, name: str, cool: bool = True) -> None:
        """No answer: refused connection, reset, closed. ``cool``: leave the box alone for ``cooldown``
        (a connection that could not even be opened); a reused connection that broke only costs the
        request a retry."""
        with self._lock:
            state = self._finish(name)
            if state is not None:
                state.unreachable += 1
                if cool:
                    state.down_until = self._clock() + self.cooldown

    def missing(self, name: str, model: str) -> None:
        """The box answered that it has no such model (its index changed): not a candidate until re-read."""
        with self._lock:
            state = self._finish(name)
            if state is not None and state.models is not None:
                state.models = state.models - {model}
