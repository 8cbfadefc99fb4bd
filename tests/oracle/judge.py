"""``python -m tests.oracle judge``: NVIDIA's qa suites against real Triton 2.51 and the appliance.

Triton is the judge: a qa test counts against the appliance only when it passes against real Triton on
this machine. Each suite runs, unchanged but for the server's address, from a copy of a checkout of
``triton-inference-server/server`` that the caller fetched (nothing of NVIDIA's is in this repository)
against both servers serving the same repository of Python-backend models (Triton's wheel has only the
Python backend, so the qa's ONNX identity models are stood in for by Python models of the same name and
config). unittest runs each file and records every test's outcome.

    python -m tests.oracle judge --qa /tmp/server/qa [--suite L0_http/http_test ...] [--report FILE]

Prints one row per test (Triton, appliance) and the tests that pass on Triton and fail here; exits 1
when there are any.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.oracle.install import install
from tests.oracle.models import ADD_SUB, ADD_SUB_CONFIG, write_python_model
from tests.oracle.server import TritonServer

__all__ = ["SUITES", "Suite", "TestResult", "main", "parse_outcomes", "rewrite_addresses"]

# One identity for every qa identity model: INPUTi -> OUTPUTi, whatever the datatype.
IDENTITY_ANY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for tensor in request.inputs():
                name = tensor.name().replace("INPUT", "OUTPUT")
                outputs.append(pb_utils.Tensor(name, tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
'''

SLOW_IDENTITY = IDENTITY_ANY.replace("        responses = []", "        import time\n        time.sleep(2)\n"
                                     "        responses = []")


def _zero_config(count: int, datatype: str, dims: str = "-1", extra: str = "") -> str:
    """The qa's ``onnx_zero_<count>_<type>`` config (gen_qa_identity_models.py): max_batch_size 8,
    INPUTi/OUTPUTi of ``dims``."""
    inputs = ", ".join(f'{{ name: "INPUT{i}" data_type: {datatype} dims: [ {dims} ] }}' for i in range(count))
    outputs = ", ".join(f'{{ name: "OUTPUT{i}" data_type: {datatype} dims: [ {dims} ] }}' for i in range(count))
    return (f'backend: "python"\nmax_batch_size: 8\ninput [ {inputs} ]\noutput [ {outputs} ]\n'
            f'instance_group [ {{ kind: KIND_CPU count: 1 }} ]\n{extra}')


def _batched_identity(datatype: str) -> str:
    return ('backend: "python"\nmax_batch_size: 8\n'
            f'input [ {{ name: "INPUT0" data_type: {datatype} dims: [ -1 ] }} ]\n'
            f'output [ {{ name: "OUTPUT0" data_type: {datatype} dims: [ -1 ] }} ]\n'
            'instance_group [ { kind: KIND_CPU count: 1 } ]\n')


def http_models(repository: Path) -> None:
    """L0_http's http_test.py repository (test.sh: qa_identity_model_repository copies, simple_identity)."""
    write_python_model(repository, "onnx_zero_1_float32", IDENTITY_ANY, _zero_config(1, "TYPE_FP32"))
    write_python_model(repository, "onnx_zero_1_object", IDENTITY_ANY, _zero_config(1, "TYPE_STRING"))
    write_python_model(repository, "onnx_zero_1_object_1_element", IDENTITY_ANY, _zero_config(1, "TYPE_STRING", "1"))
    write_python_model(repository, "onnx_zero_1_float16", IDENTITY_ANY, _zero_config(1, "TYPE_FP16"))
    write_python_model(repository, "onnx_zero_3_float32", IDENTITY_ANY, _zero_config(3, "TYPE_FP32"))
    queue = ("dynamic_batching { max_queue_delay_microseconds: 1000000 preferred_batch_size: [ 8 ] "
             "default_queue_policy { max_queue_size: 1 } }\n")
    write_python_model(repository, "onnx_zero_1_float32_queue", SLOW_IDENTITY,
                       _zero_config(1, "TYPE_FP32", extra=queue))
    write_python_model(repository, "simple_identity", IDENTITY_ANY, _batched_identity("TYPE_STRING"))
    write_python_model(repository, "simple_identity_int64", IDENTITY_ANY, _batched_identity("TYPE_INT64"))
    write_python_model(repository, "simple", ADD_SUB, ADD_SUB_CONFIG)


def shared_memory_models(qa: Path) -> Callable[[Path], None]:
    """L0_shared_memory's ``models``: simple, and python_int32_int32_int32 as its test.sh makes it."""
    def build(repository: Path) -> None:
        write_python_model(repository, "simple", ADD_SUB, ADD_SUB_CONFIG)
        add_sub = qa / "python_models" / "add_sub"
        config = (add_sub / "config.pbtxt").read_text().replace("TYPE_FP32", "TYPE_INT32") + "max_batch_size: 8\n"
        write_python_model(repository, "python_int32_int32_int32", (add_sub / "model.py").read_text(),
                           config.replace('name: "add_sub"', 'name: "python_int32_int32_int32"'))
    return build


def generate_models(qa: Path) -> Callable[[Path], None]:
    """qa/python_models/generate_models as it is (Python models: both servers run them)."""
    def build(repository: Path) -> None:
        shutil.copytree(qa / "python_models" / "generate_models", repository, dirs_exist_ok=True)
    return build


@dataclasses.dataclass(frozen=True)
class Suite:
    """One qa test file: where it lives, its models, and each server's model control mode."""

    name: str
    directory: str
    script: str
    models: Callable[[Path], Callable[[Path], None]]  # qa -> builder of the repository
    model_control: str = "none"
    appliance_args: tuple[str, ...] = ()
    environment: tuple[tuple[str, str], ...] = ()  # what its test.sh exports for this run
    only: str = ""  # run only the tests of this class (the rest need other repositories)
    server_per_test: bool = False  # its test.sh starts a server for each test


SUITES: dict[str, Suite] = {suite.name: suite for suite in (
    Suite("L0_http/http_test", "L0_http", "http_test.py", lambda qa: http_models, model_control="explicit"),
    Suite("L0_http/python_http_aio_test", "L0_http", "python_http_aio_test.py", lambda qa: http_models,
          model_control="poll"),
    Suite("L0_grpc/python_grpc_aio_test", "L0_grpc", "python_grpc_aio_test.py", lambda qa: http_models,
          model_control="poll"),
    Suite("L0_http/generate_endpoint_test", "L0_http", "generate_endpoint_test.py", generate_models),
    *(Suite(f"L0_shared_memory/{client}", "L0_shared_memory", "shared_memory_test.py", shared_memory_models,
            environment=(("CLIENT_TYPE", client), ("BACKENDS", "python")), only="SharedMemoryTest",
            server_per_test=True)
      for client in ("http", "grpc")),
)}


@dataclasses.dataclass(frozen=True)
class TestResult:
    name: str
    outcome: str  # passed | failed | error | skipped
    message: str = ""


# Runs one unittest file and writes {"Class.test": [outcome, message]} as JSON (pytest cannot run the qa's
# files: their TestResultCollector reads unittest's own result object).
_RUNNER = """
import json, sys, unittest
module, report = sys.argv[1], sys.argv[2]
outcomes = {}
def key(test):
    return type(test).__name__ + "." + test._testMethodName
class Recording(unittest.TextTestResult):
    def addSuccess(self, test):
        super().addSuccess(test); outcomes.setdefault(key(test), ["passed", ""])
    def addFailure(self, test, err):
        super().addFailure(test, err); outcomes[key(test)] = ["failed", self._exc_info_to_string(err, test)]
    def addError(self, test, err):
        super().addError(test, err)
        name = key(test) if hasattr(test, "_testMethodName") else str(test)
        outcomes[name] = ["error", self._exc_info_to_string(err, test)]
    def addSkip(self, test, reason):
        super().addSkip(test, reason); outcomes[key(test)] = ["skipped", reason]
    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            outcomes[key(test)] = ["failed", self._exc_info_to_string(err, test)]
suite = unittest.defaultTestLoader.loadTestsFromName(module)  # module.Class.test
unittest.TextTestRunner(resultclass=Recording, verbosity=2).run(suite)
open(report, "w").write(json.dumps(outcomes))
"""


_LISTER = """
import sys, unittest
def walk(suite):
    for test in suite:
        yield from walk(test) if isinstance(test, unittest.TestSuite) else [test]
for test in walk(unittest.defaultTestLoader.loadTestsFromName(sys.argv[1])):
    print(sys.argv[1] + "." + type(test).__name__ + "." + test._testMethodName)
"""


def parse_outcomes(text: str) -> dict[str, TestResult]:
    """The runner's JSON -> Class.test -> result."""
    return {name: TestResult(name, outcome, message.strip()) for name, (outcome, message) in json.loads(text).items()}


def rewrite_addresses(text: str, http: str, grpc: str) -> str:
    """The qa's fixed addresses (localhost:8000 HTTP, localhost:8001 gRPC) -> the server under test."""
    text = re.sub(r"(localhost|127\.0\.0\.1):8000\b", http, text)
    return re.sub(r"(localhost|127\.0\.0\.1):8001\b", grpc, text)


class _Target:
    """One server (``triton`` or ``appliance``) on the suite's repository, started again if a test kills it."""

    def __init__(self, kind: str, suite: Suite, repository: Path, work: Path) -> None:
        self.kind, self.suite, self.repository, self.work = kind, suite, repository, work
        self.http = self.grpc = ""
        self.restarts = -1
        self._stop: Callable[[], object] = lambda: None
        self._alive: Callable[[], bool] = lambda: False

    def ensure_up(self) -> bool:
        """Start the server unless it is up; True when it had to (the addresses changed)."""
        if self._alive() and _live(self.http):
            return False
        self.stop()
        self.restarts += 1
        control = self.suite.model_control
        if self.kind == "triton":
            server = TritonServer(self.repository, model_control=control, triton=install(),
                                  args=["--load-model=*"] if control == "explicit" else [],
                                  log_path=self.work / f"triton-{self.restarts}.log").start()
            self.http, self.grpc, self._stop, self._alive = server.http_url, server.grpc_url, server.stop, server.alive
        else:
            from bench.process import start_appliance
            args = ["--no-selection", "--model-control-mode", control, *self.suite.appliance_args]
            if control == "explicit":
                args += ["--load-model", "*"]
            daemon = start_appliance(self.repository, self.work / f"state-{self.restarts}", *args)
            self.http, self.grpc = f"127.0.0.1:{daemon.port}", f"127.0.0.1:{daemon.grpc_port}"
            self._stop, self._alive = daemon.stop, lambda: daemon.process.poll() is None
        return True

    def stop(self) -> None:
        self._stop()
        self._stop, self._alive = (lambda: None), (lambda: False)


def _live(http: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{http}/v2/health/live", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def run_suite(suite: Suite, qa: Path, work: Path, kind: str) -> dict[str, TestResult]:
    """Serve the suite's repository with ``kind`` (triton | appliance) and run its tests one by one."""
    repository = work / "models"
    suite.models(qa)(repository)
    copy = work / "qa"
    shutil.copytree(qa / suite.directory, copy / suite.directory, dirs_exist_ok=True)
    shutil.copytree(qa / "common", copy / "common", dirs_exist_ok=True)
    original = (qa / suite.directory / suite.script).read_text()
    script = copy / suite.directory / suite.script
    environment = {**os.environ, **dict(suite.environment), "PYTHONPATH": f"{copy / 'common'}:{script.parent}"}
    listed = subprocess.run([sys.executable, "-c", _LISTER, script.stem], cwd=script.parent, env=environment,
                            capture_output=True, text=True, timeout=120, check=False)
    target = _Target(kind, suite, repository, work)
    results: dict[str, TestResult] = {}
    try:
        for test in listed.stdout.split():
            if suite.only and test.split(".")[1] != suite.only:
                continue
            if suite.server_per_test:
                target.stop()
            if target.ensure_up():
                script.write_text(rewrite_addresses(original, target.http, target.grpc))
            report = work / "outcome.json"
            report.unlink(missing_ok=True)
            with open(work / "client.log", "a") as log:
                try:
                    subprocess.run([sys.executable, "-c", _RUNNER, test, str(report)], cwd=script.parent,
                                   env=environment, stdout=log, stderr=subprocess.STDOUT, timeout=600, check=False)
                except subprocess.TimeoutExpired:
                    pass
            found = parse_outcomes(report.read_text()) if report.exists() else {}
            name = test.split(".", 1)[1]
            results[name] = found.get(name, TestResult(name, "error", "the test did not finish (600 s)"))
    finally:
        target.stop()
    return results


def judge(suite: Suite, qa: Path) -> list[tuple[str, TestResult | None, TestResult | None]]:
    with tempfile.TemporaryDirectory(prefix="judge-") as scratch:
        work = Path(scratch)
        triton = run_suite(suite, qa, work / "triton", "triton")
        appliance = run_suite(suite, qa, work / "appliance", "appliance")
    return [(name, triton.get(name), appliance.get(name)) for name in sorted(set(triton) | set(appliance))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.oracle judge", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qa", type=Path, required=True, help="the qa/ folder of a server checkout")
    parser.add_argument("--suite", action="append", choices=sorted(SUITES), help="default: every suite")
    parser.add_argument("--report", type=Path, help="also write the table (Markdown) here")
    arguments = parser.parse_args(argv)
    lines = ["| suite | test | Triton 2.51 | appliance |", "|---|---|---|---|"]
    regressions: list[str] = []
    for name in arguments.suite or sorted(SUITES):
        for test, triton, appliance in judge(SUITES[name], arguments.qa.resolve()):
            cells = [result.outcome if result else "absent" for result in (triton, appliance)]
            lines.append(f"| {name} | {test} | {cells[0]} | {cells[1]} |")
            if cells[0] == "passed" and cells[1] != "passed":
                regressions.append(f"{name}::{test}: {appliance.message[:400] if appliance else 'not run'}")
    table = "\n".join(lines)
    print(table)
    print(f"\npass on Triton, not on the appliance: {len(regressions)}")
    for line in regressions:
        print(f"  {line}")
    if arguments.report:
        arguments.report.write_text(table + "\n\n" + "\n".join(regressions) + "\n")
    return 1 if regressions else 0
