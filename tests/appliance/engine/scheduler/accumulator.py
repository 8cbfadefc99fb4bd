"""An accumulator backend for the sequence batcher's tests, and the batcher over it."""

from __future__ import annotations

import threading
import time

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.core.errors import InferenceFailed
from appliance.engine.instances import InstancePool
from appliance.engine.scheduler import SequenceScheduler, sequence_policy
from appliance.engine.scheduler.execution import ExecutionMode
from appliance.engine.scheduler.sequence import THREADED_SEQUENCES
from appliance.engine.stats import ModelStats
from appliance.examples.sequence import accumulator_config
from tests.fakes import TensorlessBackend


class Accumulator(TensorlessBackend):
    """The accumulator of appliance.examples.sequence in numpy; records each batch's control rows."""

    def __init__(self, delay: float = 0.0, fail_on: int | None = None) -> None:
        self.delay = delay
        self.fail_on = fail_on
        self.batches: list[dict[str, list]] = []
        self.running: set = set()
        self.overlaps = 0
        self.threads: set[int] = set()
        self._lock = threading.Lock()

    def run(self, inputs, outputs):
        self.threads.add(threading.get_ident())
        rows = {name: inputs[name].reshape(-1).tolist() for name in ("START", "END", "READY", "INPUT")}
        rows["CORRID"] = inputs["CORRID"].reshape(-1).tolist() if "CORRID" in inputs else []
        rows["shapes"] = {name: value.shape for name, value in inputs.items()}
        self.batches.append(rows)
        ids = {c for c, r in zip(rows["CORRID"], rows["READY"]) if r}
        with self._lock:
            self.overlaps += len(ids & self.running)
            self.running |= ids
        try:
            time.sleep(self.delay)
            if self.fail_on is not None and self.fail_on in rows["INPUT"]:
                raise InferenceFailed("the model failed on purpose")
            start, ready = inputs["START"].astype(bool), inputs["READY"].astype(bool)
            total = np.where(start, 0, inputs["ACC_IN"]) + inputs["INPUT"]
            return {"OUTPUT": np.where(ready, total, 0).astype(np.int32),
                    "ACC_OUT": np.where(ready, total, inputs["ACC_IN"]).astype(np.int32),
                    "END_OUT": inputs["END"].astype(np.int32)}
        finally:
            with self._lock:
                self.running -= ids


def accumulator_model_config(text: str) -> mc.ModelConfig:
    config = text_format.Parse(text, mc.ModelConfig())
    config.name = "acc"
    return config


def sequence_scheduler(strategy: str = "direct { }", *backends: Accumulator, corrid: str | None = "UINT64",
                       max_batch_size: int = 4, idle_us: int = 0, control: str = "INT32",
                       execution: ExecutionMode = THREADED_SEQUENCES) -> SequenceScheduler:
    """A sequence batcher (not started) over ``backends`` (one new Accumulator when none) serving
    appliance.examples.sequence's accumulator config."""
    config = accumulator_model_config(accumulator_config(strategy, control, corrid, max_batch_size,
                                                         len(backends) or 1, idle_us))
    backends = backends or (Accumulator(),)
    return SequenceScheduler("acc:1", "acc", InstancePool("acc:1", list(backends)), sequence_policy(config, None),
                             ModelStats(), execution)
