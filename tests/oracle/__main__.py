"""``python -m tests.oracle install``: install real Triton into its cache now (CI runs it before the tests).

``python -m tests.oracle judge --qa DIR``: NVIDIA's qa suites against Triton and the appliance (judge.py).

Exits 0 either way: when Triton cannot be installed it prints why, and the suites that need it skip.
"""

from __future__ import annotations

import argparse
import sys
import time

from tests.oracle.install import TritonUnavailable, cache_directory, install


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["judge"]:
        from tests.oracle import judge
        return judge.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m tests.oracle", description=__doc__)
    parser.add_argument("action", choices=["install"])
    parser.add_argument("--strict", action="store_true", help="exit 1 when Triton cannot be installed")
    arguments = parser.parse_args(argv)
    started = time.monotonic()
    try:
        found = install()
    except TritonUnavailable as error:
        print(f"real Triton unavailable (the oracle tests will skip): {error}", file=sys.stderr)
        return 1 if arguments.strict else 0
    print(f"real Triton ready in {found.root} ({time.monotonic() - started:.1f} s; cache: {cache_directory()})")
    print(f"  tritonserver  {found.tritonserver}\n  perf_analyzer {found.perf_analyzer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
