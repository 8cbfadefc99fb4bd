"""Per-model scheduling between the request path and the instances (Triton's batching semantics)."""

from appliance.core.scheduler.policy import QueuePolicy, SchedulerPolicy, policy_from_config
from appliance.core.scheduler.scheduler import Scheduler

__all__ = ["QueuePolicy", "Scheduler", "SchedulerPolicy", "policy_from_config"]
