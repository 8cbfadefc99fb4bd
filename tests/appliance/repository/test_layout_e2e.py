"""A Python model whose helper module changes answers with the new code after a reload, though its
answers are cached in a Redis shared with other servers (whose namespace is the model's digest)."""

from __future__ import annotations

import os

import numpy as np
import tritonclient.http as triton

from tests.models import copy_model
from tests.redis_server import redis_server
from tests.waiting import wait_until


def _y(client: triton.InferenceServerClient) -> list[float]:
    tensor = triton.InferInput("x", [2], "FP32")
    tensor.set_data_from_numpy(np.array([1, 2], np.float32))
    return client.infer("m", [tensor]).as_numpy("y").tolist()


def test_a_changed_helper_module_is_not_answered_from_the_shared_cache(start_daemon, tmp_path):
    repo = tmp_path / "repo"
    copy_model(repo, "repository/offset", "m")
    helper = repo / "m" / "lib" / "helper.py"
    helper.parent.mkdir()
    helper.write_text("OFFSET = 1\n")
    (tmp_path / "redis").mkdir()
    with redis_server(tmp_path / "redis") as redis:
        daemon = start_daemon(repo, "--model-control-mode", "explicit", "--load-model", "m",
                              "--cache-config", "redis,host=127.0.0.1", "--cache-config", f"redis,port={redis.port}")
        with triton.InferenceServerClient(daemon.url) as client:
            assert _y(client) == [2.0, 3.0]
            wait_until(lambda: len(redis.keys()) == 1, timeout=10, what="the answer stored in Redis")
            kept = helper.stat()
            helper.write_text("OFFSET = 5\n")  # the same size and modification time: only the content differs
            os.utime(helper, ns=(kept.st_atime_ns, kept.st_mtime_ns))
            client.load_model("m")  # the load API reloads a loaded model
            assert _y(client) == [6.0, 7.0]  # the old code's answer, stored in Redis, is not served
            assert client.get_inference_statistics("m")["model_stats"][0]["inference_stats"]["cache_hit"][
                "count"] == 0
