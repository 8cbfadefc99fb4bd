"""Per-model scheduling between the request path and the instances (Triton's batching semantics): the
dynamic/default Scheduler, or the SequenceScheduler for a model with ``sequence_batching``."""

from appliance.core.scheduler.policy import QueuePolicy, SchedulerPolicy, policy_from_config
from appliance.core.scheduler.scheduler import Scheduler
from appliance.core.scheduler.sequence import SequenceScheduler
from appliance.core.scheduler.sequence_policy import SequencePolicy, sequence_policy

__all__ = ["QueuePolicy", "Scheduler", "SchedulerPolicy", "SequencePolicy", "SequenceScheduler",
           "policy_from_config", "sequence_policy"]
