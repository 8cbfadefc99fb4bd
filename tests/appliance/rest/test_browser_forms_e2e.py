"""A real browser against the shared-memory routes: headless Chromium opens a page of another origin that
tries to register a region on the daemon with the content types a page may send without a preflight (a
fetch with the form type, as perf_analyzer's libcurl labels its JSON; an auto-submitted HTML form). The
daemon must refuse both, telling the browser apart by the Origin and Fetch metadata it adds, while the
same body with the same type from a program (no browser headers) registers the region."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.builders import identity_model, write_model
from tests.http_util import call

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no `chromium` on PATH: this browser test needs it "
                                                         "(apt-get install chromium)")
FORM = "application/x-www-form-urlencoded"


def _page(daemon_port: int, page_port: int, key: str) -> str:
    register = f"http://127.0.0.1:{daemon_port}/v2/systemsharedmemory/region"
    record = f"http://127.0.0.1:{page_port}/record"
    body = json.dumps({"key": key, "byte_size": 64})
    # The form's one field is named so that the urlencoded body reads as the JSON above would, as far as
    # a form can make it: what a page would try. Each request also goes to the page's own server, which
    # records the headers Chromium adds (what the daemon tells a browser by).
    field = f"""<input type="hidden" name='{body[:-1]}, "x": "' value='"}}'>"""
    return f"""<!doctype html><html><body data-state="loading">
<iframe name="sink"></iframe><iframe name="sink2"></iframe>
<form id="f" method="post" target="sink" enctype="{FORM}" action="{register}/page_form/register">{field}</form>
<form id="g" method="post" target="sink2" enctype="{FORM}" action="{record}/form">{field}</form>
<script>
const send = (url) => fetch(url, {{method: "POST", mode: "no-cors", headers: {{"Content-Type": "{FORM}"}},
                                  body: {json.dumps(body)}}}).catch(() => null);
Promise.all([send("{register}/page_fetch/register"), send("{record}/fetch")]).then(() => {{
  document.getElementById("f").submit(); document.getElementById("g").submit();
  document.body.dataset.state = "sent";
}});
</script></body></html>"""


@pytest.fixture
def page_server():
    pages: dict[str, str] = {}
    recorded: dict[str, dict[str, str]] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            recorded[self.path] = {name.lower(): value for name, value in self.headers.items()}
            self.send_response(204)
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            data = pages.get(self.path, "").encode()
            self.send_response(200 if data else 404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], pages, recorded
    server.shutdown()
    server.server_close()


def test_a_pages_form_typed_posts_are_refused_and_a_programs_are_served(start_daemon, tmp_path: Path, regions,
                                                                          page_server):
    repository = tmp_path / "repo"
    write_model(repository, "identity", identity_model(["FP32"]))
    daemon = start_daemon(repository)
    key, _ = regions(64)
    port, pages, recorded = page_server
    pages["/attack.html"] = _page(daemon.port, port, key)
    run = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--no-first-run", "--disable-background-networking", f"--user-data-dir={tmp_path / 'p'}",
                          "--virtual-time-budget=5000", "--dump-dom", f"http://127.0.0.1:{port}/attack.html"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert 'data-state="sent"' in run.stdout  # the page did send its requests
    # What the daemon tells a browser by: every POST a page makes carries Origin and the Fetch metadata,
    # with the form type (perf_analyzer's libcurl sends the type and none of these).
    assert set(recorded) == {"/record/fetch", "/record/form"}, recorded
    for headers in recorded.values():
        assert headers["content-type"].startswith(FORM) and "origin" in headers and "sec-fetch-mode" in headers
    status, _, registered = call(daemon.port, "GET", "/v2/systemsharedmemory/status")
    assert status == 200 and registered == [], registered  # neither reached the region
    # The same request from a program (libcurl's default type, no browser headers) is served.
    status, _, payload = call(daemon.port, "POST", "/v2/systemsharedmemory/region/program/register",
                              {"key": key, "byte_size": 64}, headers={"Content-Type": FORM})
    assert status == 200, payload
    assert [region["name"] for region in call(daemon.port, "GET", "/v2/systemsharedmemory/status")[2]] == ["program"]
