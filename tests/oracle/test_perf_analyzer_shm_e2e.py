"""NVIDIA's perf_analyzer, unchanged, against the appliance with system shared memory over HTTP: it sends
its register and infer bodies with libcurl's default Content-Type (application/x-www-form-urlencoded) and
none of a browser's headers, which the browser rules tell apart from a web page's form
(tests/appliance/rest/test_browser_forms.py holds a real browser to the other side)."""

from __future__ import annotations

import pytest

from tests.builders import identity_model, write_model
from tests.oracle import TritonUnavailable, run_perf_analyzer


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_runs_with_system_shared_memory(triton_install, start_daemon, tmp_path, protocol):
    repository = tmp_path / "repo"
    write_model(repository, "identity", identity_model(["FP32"]))
    daemon = start_daemon(repository)
    url = daemon.url if protocol == "http" else daemon.grpc_url
    try:
        result = run_perf_analyzer(["-m", "identity", "-u", url, "-i", protocol, "--shared-memory", "system",
                                    "--concurrency-range", "1", "--measurement-mode", "count_windows",
                                    "--measurement-request-count", "20",
                                    # what is checked is that shared memory works, not a stable measurement:
                                    # windows on a box loaded by the other tests may differ widely
                                    "--stability-percentage", "1000"], timeout=120, triton=triton_install)
    except TritonUnavailable as error:
        pytest.fail(f"perf_analyzer failed against the appliance: {error}\n{daemon.log()[-3000:]}")
    # Measured at all means the regions were registered and read: a refusal of perf_analyzer's form-typed
    # register or infer body (415 or 403) fails its run above. (The daemon logs no statuses to look for.)
    assert result.best.throughput > 0
