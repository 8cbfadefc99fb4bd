"""Real Triton 2.51 for tests and benches: installed into a cache outside the repository, served on
loopback, measured with NVIDIA's perf_analyzer. Every entry point raises TritonUnavailable with the
reason when it cannot be done here, so tests skip with it and benches print it::

    from tests.oracle import TritonServer, TritonUnavailable, run_perf_analyzer

    with TritonServer(repository) as triton:          # installs on first use
        result = run_perf_analyzer(["-m", "identity", "-u", triton.grpc_url, "-i", "grpc",
                                    "--shape", "INPUT0:16", "--concurrency-range", "1:4:2"])
        print(result.best.throughput, result.best.p50_us, triton.pid)

``python -m tests.oracle install`` installs ahead of time (CI does) and prints where.
"""

from tests.oracle.install import CACHE_ENVIRONMENT, TritonInstall, TritonUnavailable, cache_directory, install
from tests.oracle.perf import PerfResult, PerfRow, parse_csv, run_perf_analyzer
from tests.oracle.server import TritonServer, free_port

__all__ = [
    "CACHE_ENVIRONMENT",
    "PerfResult",
    "PerfRow",
    "TritonInstall",
    "TritonServer",
    "TritonUnavailable",
    "cache_directory",
    "free_port",
    "install",
    "parse_csv",
    "run_perf_analyzer",
]
