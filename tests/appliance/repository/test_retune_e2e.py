"""A model no synthetic input can measure is served at once, then tuned on its real traffic and switched
to the measured plan while a client hammers it: no request fails, every answer is right. The decision
for that traffic is cached: after a restart the same traffic switches it without measuring again."""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import tritonclient.http as triton

from tests.builders import framing_model, write_model
from tests.http_util import call
from tests.waiting import wait_until

ENV = {"APPLIANCE_TUNE_BUDGET": "0.05", "APPLIANCE_RETUNE_INTERVAL": "0.5", "APPLIANCE_RETUNE_MIN_REQUESTS": "20"}
AUDIO = np.random.default_rng(5).standard_normal((1, 4800)).astype(np.float32)
ENERGY = (AUDIO.reshape(1, -1, 480) ** 2).mean(axis=2)


@dataclasses.dataclass
class Hammered:
    ok: int = 0
    failed: list = dataclasses.field(default_factory=list)
    decision: dict | None = None


def _selection(daemon) -> dict:
    status, _, payload = call(daemon.port, "GET", "/v2/models/frames/selection")
    assert status == 200, payload
    return payload


def _hammer_until_switched(daemon, timeout: float = 90) -> Hammered:
    """One client sending requests back to back until the model serves a measured plan, and 1 s more."""
    result = Hammered()
    stop = threading.Event()

    def client() -> None:
        with triton.InferenceServerClient(daemon.url) as connection:
            while not stop.is_set():
                tensor = triton.InferInput("audio", [1, 4800], "FP32")
                tensor.set_data_from_numpy(AUDIO)
                try:
                    energy = connection.infer("frames", [tensor]).as_numpy("energy")
                    np.testing.assert_allclose(energy, ENERGY, rtol=1e-4)
                    result.ok += 1
                except Exception as exc:  # every failure is kept, and fails the test
                    result.failed.append(repr(exc)[:300])

    thread = threading.Thread(target=client)
    thread.start()
    try:
        def measured() -> dict | None:
            decision = _selection(daemon)
            return decision if decision["status"] == "measured" else None

        try:
            decision = wait_until(measured, timeout=timeout, interval=0.2, what="the model measured")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{daemon.log()}") from None
        time.sleep(1.0)  # the old plan's instances drain and close while requests keep coming
        result.decision = decision
    finally:
        stop.set()
        thread.join()
    return result


def test_an_unmeasured_model_retunes_on_its_traffic_and_switches_without_downtime(start_daemon, tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "frames", framing_model(frame=480))
    state = tmp_path / "state"
    daemon = start_daemon(repo, selection=True, state=state, env=ENV)
    assert _selection(daemon)["status"] == "unmeasured"

    first = _hammer_until_switched(daemon)
    assert first.failed == [] and first.ok >= 20
    decision = first.decision
    assert decision["tuned_on"] == "traffic" and decision["cache"] == "miss"
    assert decision["profile"] == [{"batch": 1, "shapes": {"audio": [1, 4800]}}]
    assert decision["traffic_profile"]["concurrency"] == 1
    # The same version on another plan: its statistics count on across the switch (every request the
    # client sent is counted once), as a client reading them around a window expects.
    status, _, stats = call(daemon.port, "GET", "/v2/models/frames/stats")
    assert status == 200 and stats["model_stats"][0]["inference_stats"]["success"]["count"] == first.ok
    time.sleep(1.5)  # the new version's own traffic is judged too: it matches what it was tuned on
    assert daemon.log().count("retuning model frames version 1 on its traffic") == 1
    daemon.stop()

    again = start_daemon(repo, selection=True, state=state, env=ENV)
    assert _selection(again)["status"] == "unmeasured"  # what the files alone allow
    second = _hammer_until_switched(again)
    assert second.failed == []
    assert second.decision["cache"] == "hit" and second.decision["tuned_at"] == decision["tuned_at"]
