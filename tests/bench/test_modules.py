"""Every benchmark module imports and parses its command line (they are run by hand, so a broken import
would otherwise go unnoticed until someone measures)."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

import bench

MODULES = sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_"))


@pytest.mark.parametrize("name", MODULES)
def test_bench_module_imports(name):
    importlib.import_module(f"bench.{name}")


@pytest.mark.parametrize("name", [m for m in MODULES if hasattr(importlib.import_module(f"bench.{m}"), "main")])
def test_bench_command_line_parses(name):
    result = subprocess.run([sys.executable, "-m", f"bench.{name}", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout


def test_the_soak_and_the_fleet_signing_benches_are_checked_here():
    assert {"soak", "fleet_signing"} <= set(MODULES)


def test_the_soak_judges_growth_after_the_warm_up_against_noise():
    from bench.soak import FLOORS, judge

    def samples(rss_per_minute: float, jitter: float = 0.0) -> list[dict]:
        return [{"t": minute * 60.0, **dict.fromkeys(FLOORS, 1.0),
                 "rss_mib": 120 + (30 if minute < 10 else 0) + rss_per_minute * minute + jitter * (-1) ** minute}
                for minute in range(61)]

    flat = judge(samples(0.0, jitter=3.0), warmup_s=600)  # a warm-up spike, then noise only
    assert flat["rss_mib"]["met"] and abs(flat["rss_mib"]["slope_per_hour"]) < 1
    creeping = judge(samples(0.5), warmup_s=600)  # 30 MiB an hour: beyond the 8 MiB floor
    assert creeping["rss_mib"]["met"] is False and round(creeping["rss_mib"]["slope_per_hour"]) == 30
    assert judge(samples(0.5)[:12], warmup_s=600)["rss_mib"]["met"] is None  # too short to say
