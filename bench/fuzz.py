"""Fuzz the running daemon: schemathesis against its own OpenAPI description, then report memory.

    python -m bench.fuzz [--max-examples 100]   (pip install schemathesis first)

Starts the daemon (127.0.0.1, ephemeral port, mDNS off, explicit model control so load/unload are
exercised) on the example repository, records its RSS, runs schemathesis with the not_a_server_error
check (no 5xx) and a response-time bound (no hang), checks the daemon is still alive and answering, and
prints the case count, failures and RSS before/after.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from appliance.examples import build_example_repository
from bench.process import rss_mib, start_appliance


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-examples", type=int, default=100)
    args = parser.parse_args(argv)
    schemathesis = shutil.which("schemathesis") or str(Path(sys.executable).with_name("schemathesis"))
    with tempfile.TemporaryDirectory() as tmp:
        repo = build_example_repository(Path(tmp) / "repo")
        server = start_appliance(repo, Path(tmp) / "state", "--no-selection", "--model-control-mode", "explicit",
                                 "--load-model", "*")
        try:
            before = rss_mib(server.process.pid)
            result = subprocess.run(
                [schemathesis, "run", f"{server.base}/v2/openapi.json", "--checks", "not_a_server_error",
                 "--max-response-time", "10", "--max-examples", str(args.max_examples), "--seed", "1",
                 "--continue-on-failure"],
                capture_output=True, text=True, timeout=3000,
                cwd=tmp,  # schemathesis keeps a cache in its working directory: never the source tree
            )
            alive = server.process.poll() is None
            ready = urllib.request.urlopen(f"{server.base}/v2/health/live", timeout=5).status == 200 if alive else False
            after = rss_mib(server.process.pid) if alive else float("nan")
        finally:
            server.stop()
    interesting = re.compile(r"(passed|failed|cases|generated|Summary|error)", re.I)
    summary = [line for line in result.stdout.splitlines() if interesting.search(line)]
    text = "\n".join([
        f"schemathesis exit code {result.returncode}; daemon alive after: {alive}, live: {ready}",
        f"RSS before {before:.0f} MiB, after {after:.0f} MiB",
        *summary[-25:],
    ])
    print(text)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "fuzz.md").write_text(f"Command: python -m bench.fuzz --max-examples {args.max_examples}\n\n{text}\n\n"
                                 f"Full output:\n\n{result.stdout[-20000:]}\n")
    return 0 if result.returncode == 0 and alive else 1


if __name__ == "__main__":
    raise SystemExit(main())
