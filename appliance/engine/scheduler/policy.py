"""Scheduling policy from Triton's config: max_batch_size, dynamic_batching and its queue policies."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from appliance.core.errors import ConfigError, InvalidInput

__all__ = ["QueuePolicy", "SchedulerPolicy", "policy_from_config"]


@dataclasses.dataclass(frozen=True, slots=True)
class QueuePolicy:
    delay_on_timeout: bool = False
    """Triton's timeout_action: False = REJECT, True = DELAY (run after every request still in time)."""
    default_timeout: float = 0.0
    """Seconds a request may wait in the queue; 0 = forever."""
    allow_timeout_override: bool = False
    max_queue_size: int = 0
    """0 = unbounded."""


@dataclasses.dataclass(frozen=True, slots=True)
class SchedulerPolicy:
    max_batch_size: int = 0
    """Items per execution; 0 = the model does not batch."""
    dynamic: bool = False
    """Combine requests (dynamic_batching); otherwise each request executes alone, as Triton's default."""
    preferred_batch_sizes: tuple[int, ...] = ()
    batch_cap: int = 0
    """The most items a batch the scheduler forms may hold (0: max_batch_size): selection measured no gain
    above it on this box. A single request larger than the cap still runs whole."""
    max_queue_delay: float = 0.0
    """Seconds the oldest request may wait for others to join its batch."""
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority: int = 0
    queue_policies: Mapping[int, QueuePolicy] = dataclasses.field(default_factory=dict)
    default_queue_policy: QueuePolicy = QueuePolicy()

    @property
    def levels(self) -> int:
        return max(self.priority_levels, 1)

    def queue_policy(self, level: int) -> QueuePolicy:
        return self.queue_policies.get(level, self.default_queue_policy)

    def level_of(self, parameters: Mapping[str, Any]) -> int:
        """The 0-based queue index for a request's ``priority`` parameter (1 = highest, as Triton)."""
        priority = parameters.get("priority", 0)
        if type(priority) is not int or priority < 0:
            # Triton's words (its gRPC front end; over HTTP its JSON parser refuses it), then what came
            raise InvalidInput("invalid value type for 'priority' parameter, expected int64_param or uint64_param.; "
                               f"got {priority!r}"[:200])
        if self.priority_levels == 0:
            return 0
        if priority == 0:
            priority = self.default_priority or self.priority_levels
        if priority > self.priority_levels:
            raise InvalidInput(
                f"'priority' {priority} is out of range; this model has priority levels 1..{self.priority_levels}"
            )
        return priority - 1

    def timeout_of(self, level: int, parameters: Mapping[str, Any]) -> float:
        """Seconds the request may stay queued (0 = no limit); the ``timeout`` parameter is in µs."""
        policy = self.queue_policy(level)
        requested = parameters.get("timeout")
        if requested is not None and (type(requested) is not int or requested < 0):
            raise InvalidInput("invalid value type for 'timeout' parameter, expected int64_param.; a number of "
                               f"microseconds, got {requested!r}"[:200])
        if requested is not None and policy.allow_timeout_override:
            return requested / 1e6
        return policy.default_timeout


def _queue_policy(raw: mc.ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        delay_on_timeout=raw.timeout_action == mc.ModelQueuePolicy.DELAY,
        default_timeout=raw.default_timeout_microseconds / 1e6,
        allow_timeout_override=raw.allow_timeout_override,
        max_queue_size=max(raw.max_queue_size, 0),
    )


def policy_from_config(config: mc.ModelConfig) -> SchedulerPolicy:
    if not config.HasField("dynamic_batching"):
        return SchedulerPolicy(max_batch_size=config.max_batch_size)
    dyn = config.dynamic_batching
    preferred = tuple(sorted(set(dyn.preferred_batch_size)))
    if config.max_batch_size > 0:
        too_big = [p for p in preferred if p > config.max_batch_size or p < 1]
        if too_big:
            raise ConfigError(
                f"model {config.name!r}: preferred_batch_size {too_big} must lie in 1..max_batch_size "
                f"({config.max_batch_size})"
            )
    if dyn.priority_levels and not 0 <= dyn.default_priority_level <= dyn.priority_levels:
        raise ConfigError(
            f"model {config.name!r}: default_priority_level {dyn.default_priority_level} is outside "
            f"1..priority_levels ({dyn.priority_levels})"
        )
    for level in dyn.priority_queue_policy:
        if not 1 <= level <= dyn.priority_levels:
            raise ConfigError(
                f"model {config.name!r}: priority_queue_policy for level {level}, but priority_levels is "
                f"{dyn.priority_levels}"
            )
    return SchedulerPolicy(
        max_batch_size=config.max_batch_size,
        dynamic=config.max_batch_size > 0,
        preferred_batch_sizes=preferred,
        max_queue_delay=dyn.max_queue_delay_microseconds / 1e6,
        preserve_ordering=dyn.preserve_ordering,
        priority_levels=dyn.priority_levels,
        default_priority=dyn.default_priority_level,
        queue_policies={level - 1: _queue_policy(p) for level, p in dyn.priority_queue_policy.items()},
        default_queue_policy=_queue_policy(dyn.default_queue_policy),
    )
