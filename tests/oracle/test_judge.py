"""The qa judge's own parts that need no NVIDIA code: addresses rewritten, outcomes read, and the
stand-in models served (the judge itself runs against a fetched qa checkout: ``python -m tests.oracle judge``)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.oracle.judge import _RUNNER, SUITES, http_models, parse_outcomes, rewrite_addresses


def test_the_qas_fixed_addresses_point_at_the_server_under_test():
    text = 'url="localhost:8000" grpc("localhost:8001") "http://localhost:8000/v2" "localhost:80001" 127.0.0.1:8000'
    assert rewrite_addresses(text, "127.0.0.1:4000", "127.0.0.1:4001") == (
        'url="127.0.0.1:4000" grpc("127.0.0.1:4001") "http://127.0.0.1:4000/v2" "localhost:80001" 127.0.0.1:4000')


def test_the_runner_records_each_outcome(tmp_path):
    (tmp_path / "sample_test.py").write_text(
        "import unittest\n"
        "class T(unittest.TestCase):\n"
        "    def test_ok(self): pass\n"
        "    def test_bad(self): self.assertEqual(1, 2)\n"
        "    def test_broken(self): raise RuntimeError('boom')\n"
        "    def test_sub(self):\n"
        "        for i in range(2):\n"
        "            with self.subTest(i=i): self.assertLess(i, 1)\n"
        "    @unittest.skip('no GPU')\n"
        "    def test_skipped(self): pass\n")
    report = tmp_path / "out.json"
    for name in ("ok", "bad", "broken", "sub", "skipped"):
        subprocess.run([sys.executable, "-c", _RUNNER, f"sample_test.T.test_{name}", str(report)], cwd=tmp_path,
                       capture_output=True, check=False, timeout=60)
        outcome = parse_outcomes(report.read_text())[f"T.test_{name}"]
        expected = {"ok": "passed", "bad": "failed", "broken": "error", "sub": "failed", "skipped": "skipped"}[name]
        assert outcome.outcome == expected, (name, outcome)
    assert "boom" in parse_outcomes(json.dumps({"T.x": ["error", " boom \n"]}))["T.x"].message


def test_the_stand_in_repository_loads_in_the_appliance(module_daemon, tmp_path_factory):
    repository = tmp_path_factory.mktemp("qa-http")
    http_models(repository)
    daemon = module_daemon(repository)
    import tritonclient.http as httpclient
    with httpclient.InferenceServerClient(daemon.url) as client:
        names = {row["name"] for row in client.get_model_repository_index() if row.get("state") == "READY"}
    assert names == {path.name for path in repository.iterdir()}
    assert set(SUITES) >= {"L0_http/http_test", "L0_shared_memory/grpc"}
