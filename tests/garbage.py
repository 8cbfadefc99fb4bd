"""What a stretch of a test left for the cyclic garbage collector: a request on a straight line frees
every object it made by its last reference, and a cycle left behind costs each request the collector's
passes (and the caches they cool)."""

from __future__ import annotations

import collections
import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def appliance_cycles() -> Iterator[collections.Counter[str]]:
    """Counts, by class name, the appliance's objects that only a collection could free among what the
    ``with`` block made (empty when it left none)."""
    found: collections.Counter[str] = collections.Counter()
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds unreachable is kept in gc.garbage
    try:
        yield found
        gc.collect()
        found.update(type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("appliance"))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
