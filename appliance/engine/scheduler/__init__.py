"""Per-model scheduling between the request path and the instances (Triton's batching semantics): the
dynamic/default Scheduler, or the SequenceScheduler for a model with ``sequence_batching``."""

from appliance.engine.scheduler.policy import QueuePolicy, SchedulerPolicy, policy_from_config
from appliance.engine.scheduler.scheduler import Scheduler
from appliance.engine.scheduler.sequence import SequenceScheduler
from appliance.engine.scheduler.sequence_policy import SequencePolicy, sequence_policy

__all__ = ["QueuePolicy", "Scheduler", "SchedulerPolicy", "SequencePolicy", "SequenceScheduler",
           "policy_from_config", "sequence_policy"]
