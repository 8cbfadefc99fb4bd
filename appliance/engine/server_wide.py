"""What every model version of one server shares beyond its own scheduler: the response cache and the
rate limiter. Built once by the composition root from the settings, handed to the registry, which hands
it to each model it loads."""

from __future__ import annotations

import dataclasses

from appliance.engine.rate_limiter import RateLimiter
from appliance.engine.response_cache import ResponseStore

__all__ = ["ServerWide"]


@dataclasses.dataclass(frozen=True, slots=True)
class ServerWide:
    response_cache: ResponseStore | None = None
    """None: the server keeps no responses (no ``cache_config``), whatever the models' configs say."""
    rate_limiter: RateLimiter | None = None
    """None: ``rate_limit = off``; instances run as soon as they are free, whatever their ``rate_limiter``."""
