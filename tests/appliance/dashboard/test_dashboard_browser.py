"""The dashboard in a real browser: the daemon serves GET /, headless Chromium runs the page's scripts
against the daemon's JSON APIs, and the page reports on <body> what it drew.

Chromium is driven as a plain subprocess (--dump-dom, --screenshot), so the test needs no Python
browser bindings; it is skipped where no ``chromium`` is on PATH (Debian: ``apt-get install chromium``).
The screenshot is kept in artifacts/dashboard.png for a person to look at.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from appliance.dashboard import STATIC_DIR
from appliance.examples import mlp_model
from tests.builders import save
from tests.http_util import call
from tests.models import copy_model
from tests.readonly import read_only_prefix
from tests.waiting import wait_until

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no `chromium` on PATH: the dashboard browser test needs it (apt-get install chromium)"
)

ARTIFACTS = Path(__file__).resolve().parents[3] / "artifacts"
REQUESTS = 50
# Virtual time runs the page's 5 s refresh a few times; network waits still take real time.
BROWSER_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
    "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--virtual-time-budget=15000",
)
_BODY = re.compile(r"<body\b([^>]*)>")
_ATTRIBUTE = re.compile(r'([\w-]+)="([^"]*)"')


def _chromium(url: str, profile: Path, *flags: str) -> subprocess.CompletedProcess:
    # A fresh profile per run: nothing cached from an earlier daemon on a reused port.
    shutil.rmtree(profile, ignore_errors=True)
    return subprocess.run(
        [CHROMIUM, *BROWSER_FLAGS, f"--user-data-dir={profile}", *flags, url],
        capture_output=True, text=True, timeout=120,
    )


def _body_attributes(dom: str) -> dict[str, str]:
    match = _BODY.search(dom)
    assert match, f"no <body> in the dumped DOM:\n{dom[:2000]}"
    return dict(_ATTRIBUTE.findall(match.group(1)))


def _page_console(stderr: str, base: str) -> list[str]:
    # --enable-logging prints every console message at one level (INFO:CONSOLE), so the page writes to
    # the console only when something went wrong: any line from it, and any uncaught error, is a failure.
    return [line for line in stderr.splitlines() if ("CONSOLE" in line and base in line) or "Uncaught" in line]


def _render(url: str, base: str, profile: Path, attempts: int = 3) -> tuple[dict[str, str], str, list[str]]:
    """(body attributes, DOM, console lines) of the first run that got past loading."""
    for _ in range(attempts):
        run = _chromium(url, profile, "--enable-logging=stderr", "--v=0", "--dump-dom")
        assert run.returncode == 0, f"chromium failed ({run.returncode}):\n{run.stderr[-4000:]}"
        body = _body_attributes(run.stdout)
        if body.get("data-state") != "loading":
            return body, run.stdout, _page_console(run.stderr, base)
        time.sleep(1)  # the daemon was slow to answer within the virtual time budget: look again
    return body, run.stdout, _page_console(run.stderr, base)


# tests/models/dashboard/broken fails to load with a long, many-line reason whose first line is this: the
# models table shows it, the rest on demand.
_BROKEN_FIRST_LINE = "the converter refused this model"


@pytest.fixture(scope="module")
def busy_daemon(module_daemon, tmp_path_factory):
    repo = tmp_path_factory.mktemp("dashboard") / "repo"
    save(mlp_model(), repo / "mlp" / "1" / "model.onnx")
    copy_model(repo, "dashboard/broken")
    # Measured selection (a short budget): the page shows the chosen plan and its alternatives.
    daemon = module_daemon(repo, selection=True, env={"APPLIANCE_TUNE_BUDGET": "0.05"})
    body = {"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": [0.5] * 784}]}
    for _ in range(REQUESTS):
        status, _, payload = call(daemon.port, "POST", "/v2/models/mlp/infer", body)
        assert status == 200, payload
    wait_until(lambda: _requests_in_history(daemon) >= REQUESTS, timeout=30, interval=0.2,
               what="the traffic in the history (the metrics writer flushes every second)")
    return daemon


def _requests_in_history(daemon) -> int:
    now = int(time.time()) + 1
    status, _, history = call(daemon.port, "GET", f"/v2/history?since={now - 600}&until={now}&step=1")
    assert status == 200, history
    return sum(r for r in history["series"]["requests"] if r)


def _assert_rendered(daemon, body: dict[str, str], dom: str, console: list[str]) -> None:
    banner = re.search(r'<div class="banner" id="error"[^>]*>([^<]*)<', dom)
    assert body.get("data-state") == "rendered", (
        f"dashboard state {body.get('data-state')!r}: {banner.group(1) if banner else ''}\n"
        f"console: {console}\ndaemon log:\n{daemon.log()[-3000:]}"
    )
    assert console == [], "the page reported errors on the console:\n" + "\n".join(console)
    assert int(body["data-charts"]) >= 4, body
    assert int(body["data-points"]) > 0, body
    assert '<figure class="chart" data-chart="throughput">' in dom, "the throughput chart shows no traffic"


@needs_chromium
def test_dashboard_renders_models_and_live_charts(busy_daemon, tmp_path):
    daemon = busy_daemon
    url = daemon.base + "/"
    body, dom, console = _render(url, daemon.base, tmp_path / "profile")
    _assert_rendered(daemon, body, dom, console)

    # The header names the box (GET /v2/health's box), never the protocol's server name "triton".
    status, _, health = call(daemon.port, "GET", "/v2/health")
    assert status == 200, health
    assert re.search(rf'<h1 id="box-name"[^>]*>{re.escape(health["box"]["name"])}</h1>', dom), "box name not shown"
    assert '<h1 id="box-name">triton</h1>' not in dom
    # A long failure: its first line in the table, the whole text folded away until asked for.
    folded = re.search(r'<details class="reason long-text"><summary[^>]*>([^<]*)</summary><pre>([^<]*)</pre>', dom)
    assert folded, "the broken model's long reason is not folded"
    assert _BROKEN_FIRST_LINE in folded.group(1) and "detail line" not in folded.group(1)
    assert "detail line 19 of the converter" in folded.group(2)

    # The charts begin at the history's first sample, not an hour before a daemon that started minutes ago.
    assert 60 <= int(body["data-window-seconds"]) < 3000, body
    # The model with its state, its chosen plan and every measured alternative; the box's fingerprint.
    assert '<td class="model-name">mlp</td>' in dom
    assert re.search(r">plan cache (miss|hit)<", dom), "the plan cache's pill does not say which cache it means"
    assert ">READY<" in dom
    status, _, selection = call(daemon.port, "GET", "/v2/models/mlp/selection")
    assert status == 200, selection
    assert f'<span class="plan chosen">{selection["chosen"]}</span>' in dom
    for candidate in selection["candidates"]:
        assert f"{candidate['plan']}</td>" in dom, f"alternative {candidate['plan']} not listed"
    status, _, probe = call(daemon.port, "GET", "/v2/probe")
    assert status == 200, probe
    assert re.search(rf'id="box-fingerprint"[^>]*>{re.escape(probe["fingerprint"])}<', dom), "fingerprint not shown"
    assert body.get("data-degraded") == "false"
    assert '<div class="banner warn" id="degraded" role="status" hidden="">' in dom
    # The fleet panel (GET /v2/fleet) says why it lists no box: the test daemon runs with --no-mdns.
    assert re.search(r'id="fleet-boxes".*mDNS is off on this box \(--no-mdns\)', dom, re.S), "fleet panel"

    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "dashboard.png"
    screenshot.unlink(missing_ok=True)
    run = _chromium(url, tmp_path / "profile", f"--screenshot={screenshot}", "--window-size=1400,1000")
    assert run.returncode == 0, run.stderr[-4000:]
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_chromium
def test_dashboard_day_view_of_one_model(busy_daemon, tmp_path):
    """The view in the URL: a day in 5-minute steps, filtered to one model."""
    daemon = busy_daemon
    body, dom, console = _render(daemon.base + "/#range=day&model=mlp", daemon.base, tmp_path / "profile")
    _assert_rendered(daemon, body, dom, console)
    assert '<button type="button" role="radio" data-range="day" aria-checked="true">' in dom


@needs_chromium
def test_dashboard_shows_a_banner_when_the_state_dir_is_read_only(start_daemon, tmp_path):
    repo = tmp_path / "repo"
    save(mlp_model(), repo / "mlp" / "1" / "model.onnx")
    state = tmp_path / "state"
    state.mkdir()
    daemon = start_daemon(repo, state=state, prefix=read_only_prefix(state))
    body, dom, console = _render(daemon.base + "/", daemon.base, tmp_path / "profile")
    assert body.get("data-state") == "rendered", f"{body}\ndaemon log:\n{daemon.log()[-3000:]}"
    assert console == [], "the page reported errors on the console:\n" + "\n".join(console)
    assert body.get("data-degraded") == "true"
    banner = re.search(r'<div class="banner warn" id="degraded" role="status"([^>]*)>(.*?)</div>', dom, re.S)
    assert banner, "no state banner on the page"
    assert "hidden" not in banner.group(1), "the state banner is hidden"
    text = banner.group(2)
    assert f"the state dir {state} is read-only" in text and "Read-only file system" in text
    assert '<li data-kind="read_only">' in text and "To fix:" in text
    assert '<td class="model-name">mlp</td>' in dom and ">READY<" in dom  # and the models are served

    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "dashboard-read-only.png"
    screenshot.unlink(missing_ok=True)
    run = _chromium(daemon.base + "/", tmp_path / "profile", f"--screenshot={screenshot}", "--window-size=1400,1000")
    assert run.returncode == 0, run.stderr[-4000:]


@needs_chromium
def test_dashboard_shows_the_response_cache_hit_rate(start_daemon, tmp_path):
    repo = tmp_path / "repo"
    save(mlp_model(), repo / "mlp" / "1" / "model.onnx")
    (repo / "mlp" / "config.pbtxt").write_text("max_batch_size: 8\nresponse_cache { enable: true }\n")
    daemon = start_daemon(repo, "--cache-config", "local,size=1048576")
    body = {"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": [0.25] * 784}]}
    for _ in range(4):  # one miss, then three hits
        status, _, payload = call(daemon.port, "POST", "/v2/models/mlp/infer", body)
        assert status == 200, payload
    page, dom, console = _render(daemon.base + "/", daemon.base, tmp_path / "profile")
    assert page.get("data-state") == "rendered", f"{page}\ndaemon log:\n{daemon.log()[-3000:]}"
    assert console == [], "the page reported errors on the console:\n" + "\n".join(console)
    assert re.search(r'<div class="tile-label">Response cache</div><div class="tile-value">75\.0 %</div>'
                     r'<div class="tile-note">hit rate · 3 hits, 1 misses</div>', dom), "no hit-rate tile"
    assert "responses 75.0 % from cache" in dom, "the model's row shows no hit rate"


def _shown_bytes(n: float) -> str:
    """The page's fmt.bytes: 1024-based units, one decimal below 100."""
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    i = 0
    while abs(n) >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return f"{n:.{0 if n >= 100 or i == 0 else 1}f} {units[i]}"


@needs_chromium
def test_dashboard_shows_what_a_model_loaded_on_demand_holds(start_daemon, tmp_path):
    repo = tmp_path / "repo"
    save(mlp_model(), repo / "mlp" / "1" / "model.onnx")
    # Its memory_mib is the floor of what it is counted at: the figure is known however little it grew.
    (repo / "mlp" / "config.pbtxt").write_text('parameters { key: "memory_mib" value { string_value: "24" } }\n')
    save(mlp_model(), repo / "later" / "1" / "model.onnx")
    daemon = start_daemon(repo, "--load-on-demand", "--model-memory-budget-mib", "512")
    body = {"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": [0.5] * 784}]}
    status, _, payload = call(daemon.port, "POST", "/v2/models/mlp/infer", body)  # loads it on demand
    assert status == 200, payload
    status, _, rows = call(daemon.port, "POST", "/v2/repository/index", {})
    assert status == 200, rows
    row = next(r for r in rows if r["name"] == "mlp")
    assert row["load_cause"] == "demand" and row["memory_bytes"] >= 24 << 20, row
    status, _, memory = call(daemon.port, "GET", "/v2/memory")
    assert status == 200 and memory["budget_bytes"] == 512 << 20, memory

    page, dom, console = _render(daemon.base + "/", daemon.base, tmp_path / "profile")
    assert page.get("data-state") == "rendered", f"{page}\ndaemon log:\n{daemon.log()[-3000:]}"
    assert console == [], "the page reported errors on the console:\n" + "\n".join(console)
    assert page.get("data-memory") == "on", page
    shown = re.search(r'<tr data-model="mlp">.*?<div class="residence"><span class="mono memory"[^>]*>([^<]*)</span>'
                      r'<div class="meta"><span class="pill neutral">loaded on demand</span></div>', dom, re.S)
    assert shown, "the mlp row shows no memory figure and load cause"
    # The figure is measured again as the model runs: the page shows the one of its moment, between the
    # index read before it and one read after.
    status, _, rows = call(daemon.port, "POST", "/v2/repository/index", {})
    later = next(r for r in rows if r["name"] == "mlp")["memory_bytes"]
    low, high = sorted((row["memory_bytes"], later))
    assert shown.group(1) in {_shown_bytes(low), _shown_bytes(high)} or (
        shown.group(1).endswith(" MiB") and low / 2**20 - 0.05 <= float(shown.group(1)[:-4]) <= high / 2**20 + 0.05
    ), (shown.group(1), low, high)
    # The model not loaded yet holds nothing and says why in its reason; the budget's tile.
    assert re.search(r'<tr data-model="later">.*?loads on its first request \(load_on_demand\)', dom, re.S)
    assert re.search(r'<div class="tile-label">Model memory</div><div class="tile-value">[^<]* / 512 MiB</div>', dom), (
        "no model memory tile with the budget")


def test_page_loads_nothing_from_outside_the_daemon():
    """Offline boxes: the page and its vendored chart library come from the daemon, no CDN."""
    for name in ("index.html", "app.js", "style.css"):
        text = (STATIC_DIR / name).read_text()
        assert not re.search(r"https?://|//cdn|@import", text), f"{name} reaches outside the daemon"
    index = (STATIC_DIR / "index.html").read_text()
    for path in ("vendor/uPlot.iife.min.js", "vendor/uPlot.min.css", "app.js", "style.css"):
        assert f"/dashboard/static/{path}" in index
        assert (STATIC_DIR / path).is_file(), path
    vendored = (STATIC_DIR / "vendor" / "uPlot.iife.min.js").read_text()[:200]
    version = re.search(r"\(v(\d+\.\d+\.\d+)\)", vendored).group(1)
    assert f"uPlot {version}" in (STATIC_DIR / "vendor" / "README.md").read_text(), "vendor/README.md is stale"
