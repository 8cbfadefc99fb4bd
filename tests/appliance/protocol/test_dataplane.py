"""The data plane's view of the registry, without any transport: what every front end asks of the server."""

from __future__ import annotations

import asyncio
import threading
from unittest import mock

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from appliance import __version__
from appliance.backends import RuntimeOptions
from appliance.core.errors import (
    Forbidden,
    InvalidInput,
    LoadRefused,
    ModelNotFound,
    NotSupported,
    Unavailable,
)
from appliance.engine.types import InferInput, InferRequest, RequestedOutput, SharedMemoryRef
from appliance.examples import build_example_repository
from appliance.protocol.admission import Caller
from appliance.protocol.dataplane import SERVER_NAME, DataPlane, Rules
from appliance.protocol.inference import DECODE_OFF_LOOP_BYTES
from appliance.protocol.results import IndexEntry, TensorMetadata
from appliance.protocol.shared_memory import LocalPeers, SharedMemoryLimits, SharedMemoryRegistry
from appliance.repository.registry import ModelRegistry
from appliance.security.budget import MemoryBudget
from tests.appliance.protocol.sources import LOCAL, Decoded


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The example repository (simple, simple_string, mlp) and a model that cannot load."""
    repo = build_example_repository(tmp_path_factory.mktemp("example") / "repo")
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not onnx")
    return repo


@pytest.fixture
async def registry(example):
    registry = ModelRegistry(example, RuntimeOptions())
    yield registry
    await registry.close(5)


@pytest.fixture
async def plane(registry):
    """Every model loaded (the broken one failed), explicit model control, start-up load finished."""
    await registry.load_all()
    plane = DataPlane(registry, Rules(control_mode="explicit"))
    plane.mark_loaded()
    return plane


async def test_status_line_does_not_count_models_left_unloaded_as_failed(registry):
    await asyncio.to_thread(registry.discover)
    await registry.load_all(["simple", "broken"])  # explicit mode: the rest stay unloaded on purpose
    line = DataPlane(registry, Rules(control_mode="explicit")).status_line()
    assert line == "1 models ready, 0 loading/tuning, 1 failed, 2 not loaded"


async def test_ready_once_loaded_and_then_only_when_every_model_is_unless_not_strict(registry):
    await registry.load_all()
    strict, lenient = DataPlane(registry), DataPlane(registry, Rules(strict_readiness=False))
    assert not strict.ready() and not lenient.ready()  # the start-up load has not finished
    for plane in (strict, lenient):
        plane.mark_loaded()
    assert lenient.ready() and not strict.ready()  # "broken" failed
    assert strict.live()
    strict.fail("the repository load died")
    assert not strict.live() and strict.failure == "the repository load died"


async def test_health_names_the_box_for_people_while_metadata_keeps_tritons_name(registry):
    plane = DataPlane(registry, Rules(box_name="kitchen", host="kitchen.lan"))
    health = plane.health().as_json()
    assert health["box"] == {"name": "kitchen", "host": "kitchen.lan"}
    assert plane.server_metadata().name == SERVER_NAME == "triton"


async def test_server_and_model_metadata(plane):
    server = plane.server_metadata()
    assert server.name == SERVER_NAME and server.version == __version__ and "statistics" in server.extensions
    metadata = plane.model_metadata("simple")
    assert metadata.versions == ("1",) and metadata.platform == "onnxruntime_onnx"
    assert metadata.inputs == (TensorMetadata("INPUT0", "INT32", (-1, 16)), TensorMetadata("INPUT1", "INT32", (-1, 16)))
    assert metadata.as_json()["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]}
    assert plane.model_ready("simple") and not plane.model_ready("broken")
    # Triton: a model that failed to load (or was unloaded) "has no available versions" (NOT_FOUND).
    with pytest.raises(ModelNotFound, match="'broken' has no available versions; .*onnxruntime cannot load"):
        plane.model_metadata("broken")


async def test_model_config_is_tritons_message_auto_completed(plane):
    config = plane.model_config("mlp")  # no config.pbtxt: completed from the model
    assert config.name == "mlp" and config.backend == "onnxruntime"
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [("input", mc.TYPE_FP32, [784])]


async def test_statistics_of_every_version_one_model_or_one_version(plane):
    names = [row.name for row in plane.model_statistics()]
    assert names == ["mlp", "simple", "simple_string"]
    (row,) = plane.model_statistics("simple")
    assert row.version == "1" and row.statistics["inference_stats"]["success"] == {"count": 0, "ns": 0}
    assert row.as_json()["name"] == "simple"
    assert plane.model_statistics("simple", "1") == plane.model_statistics("simple")
    # Triton's words and status (INVALID_ARG) for a model or version that does not serve.
    with pytest.raises(InvalidInput, match="requested model 'nope' is not available"):
        plane.model_statistics("nope")
    with pytest.raises(InvalidInput, match="requested model version is not available for model 'simple'"):
        plane.model_statistics("simple", "7")


async def test_an_unknown_model_is_not_ready_rather_than_an_error(plane):
    assert plane.model_ready("simple") and not plane.model_ready("nope") and not plane.model_ready("simple", "7")


async def test_selection_off_says_what_serves(plane):
    selection = plane.model_selection("simple")
    assert selection["status"] == "off" and "--no-selection" in selection["reason"]


async def test_selection_of_an_unknown_model_is_not_found(plane):
    with pytest.raises(ModelNotFound):
        plane.model_selection("nope")


async def test_model_control_needs_explicit_mode(registry):
    await registry.load_all()
    plane = DataPlane(registry, Rules(control_mode="none"))
    # Triton's words and status (UNAVAILABLE), then the fix.
    with pytest.raises(Unavailable, match="^explicit model load / unload is not allowed if polling is enabled; .*"
                                          "--model-control-mode explicit"):
        await plane.load_model("simple", {})
    with pytest.raises(Unavailable, match="^explicit model load / unload is not allowed if polling is enabled"):
        await plane.unload_model("simple")


async def test_unloading_a_model_that_is_not_there_succeeds(plane):
    await plane.unload_model("nope")  # as Triton: idempotent unload scripts work
    assert "nope" not in [row.name for row in plane.repository_index()]


async def test_an_unloaded_model_keeps_an_index_row_per_version(plane):
    await plane.unload_model("simple")
    (row,) = [row for row in plane.repository_index() if row.name == "simple"]
    assert row.as_json() == {"name": "simple", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded",
                             "origin": "repository"}
    assert IndexEntry("mlp", "READY", "", "repository", "1").as_json() == {
        "name": "mlp", "version": "1", "state": "READY", "origin": "repository"}  # no empty reason, as Triton


async def test_load_with_a_config_override_and_what_a_load_refuses(plane):
    await plane.load_model("simple", {"config": '{"max_batch_size": 2}'})
    assert plane.model_config("simple").max_batch_size == 2
    with pytest.raises(NotSupported, match="keeps no pushed models"):  # no PushStore: see test_pushed.py
        await plane.load_model("simple", {"file:1/model.onnx": "AAAA"})
    with pytest.raises(LoadRefused, match="failed to load 'simple', failed to poll from model repository: "):
        await plane.load_model("simple", {"config": "{not json"})
    with pytest.raises(InvalidInput, match="invalid model name"):
        await plane.load_model("../simple", {})
    assert plane.model_config("simple").max_batch_size == 2  # the refused loads changed nothing


async def test_repository_index_after_an_unload(plane):
    await plane.unload_model("simple_string")
    rows = {row.name: row for row in plane.repository_index()}
    assert rows["simple"] == IndexEntry("simple", "READY", "", "repository", "1")
    assert rows["simple_string"].as_json() == {"name": "simple_string", "version": "1", "state": "UNAVAILABLE",
                                               "reason": "unloaded", "origin": "repository"}
    assert rows["broken"].state == "UNAVAILABLE" and "onnxruntime cannot load" in rows["broken"].reason
    assert [row.name for row in plane.repository_index(ready_only=True)] == ["mlp", "simple"]


class _Threaded(Decoded):
    """Records the thread its request was decoded on."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.thread: str | None = None

    def decode(self, model, limits, reserve):
        self.thread = threading.current_thread().name
        return super().decode(model, limits, reserve)


def _simple_request(shared: bool = False) -> InferRequest:
    ones = np.ones((1, 16), np.int32)
    outputs = [RequestedOutput("OUTPUT0", shared_memory=SharedMemoryRef("out", 64))] if shared else []
    return InferRequest([InferInput("INPUT0", "INT32", ones), InferInput("INPUT1", "INT32", ones)], outputs)


async def test_infer_holds_the_model_counts_the_bytes_and_decodes_large_requests_off_the_loop(registry):
    await registry.load_all(["simple"])
    budget = MemoryBudget(1 << 30)
    plane = DataPlane(registry, budget=budget)
    small, large = _Threaded("simple", _simple_request(), size=10), _Threaded("simple", _simple_request(),
                                                                                size=DECODE_OFF_LOOP_BYTES + 1)
    for source in (small, large):
        async with plane.infer(LOCAL, source) as result:
            assert budget.used == source._size
            assert result.response.outputs[0].data.tolist() == [[2] * 16]
    assert budget.used == 0
    assert small.thread == threading.current_thread().name and large.thread != small.thread
    with pytest.raises(ModelNotFound):
        async with plane.infer(LOCAL, Decoded("nope", _simple_request())):
            pass


async def test_a_request_naming_shared_memory_gets_the_browser_rules_and_needs_it_served(registry):
    await registry.load_all(["simple"])
    plane = DataPlane(registry)  # no shared memory served
    with pytest.raises(NotSupported, match="shared memory is not served"):
        async with plane.infer(LOCAL, Decoded("simple", _simple_request(shared=True))):
            pass
    served = DataPlane(registry, shared_memory=SharedMemoryRegistry("local", SharedMemoryLimits(),
                                                                    LocalPeers(["127.0.0.0/8"])))
    page = Caller("127.0.0.1", browser_refusal=Forbidden("a page of another site sent it"))
    with pytest.raises(Forbidden, match="another site"):
        async with served.infer(page, Decoded("simple", _simple_request(shared=True))):
            pass
    async with served.infer(page, Decoded("simple", _simple_request())) as result:  # no region: no browser rule
        assert result.response.outputs


class _OneModel:
    """A registry that has one model, whatever the name."""

    def __init__(self, model) -> None:
        self.model = model

    def get(self, name, version=None):
        return self.model


async def test_a_decoupled_model_is_refused_where_one_response_goes_back(registry):
    await registry.load_all(["simple"])
    model = registry.get("simple")
    decoupled = mock.Mock(wraps=model, decoupled=True)
    decoupled.name = "chatty"
    decoupled.hold = lambda: decoupled
    plane = DataPlane(_OneModel(decoupled))  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="the test's end point doesn't support models with decoupled transaction "
                                           "policy; call model 'chatty' through a stream"):
        async with plane.infer(LOCAL, Decoded("chatty", _simple_request())):
            pass


async def test_hardware_is_unavailable_until_the_probe_reports(registry):
    report: asyncio.Future = asyncio.get_running_loop().create_future()
    plane = DataPlane(registry, hardware=report)
    with pytest.raises(Unavailable, match="still running"):
        plane.hardware()
    report.set_result({"accelerators": ["cpu"]})
    assert plane.hardware() == {"accelerators": ["cpu"]}


async def test_trace_settings_of_a_model_not_ready_are_refused_as_triton_refuses_them(plane):
    # Triton 2.51 (and L0_trace trace_endpoint_test): INVALID_ARG "Request for unknown model : <name>" for an
    # unknown model and for one that is not ready alike.
    for name in ("nope", "broken"):
        with pytest.raises(InvalidInput) as refused:
            plane.trace_settings(name)
        assert refused.value.message == f"Request for unknown model : {name}"
    await plane.unload_model("simple_string")
    with pytest.raises(InvalidInput, match="Request for unknown model : simple_string"):
        plane.trace_settings("simple_string", {"trace_rate": ["7"]})
    assert plane.trace_settings("simple", {"trace_rate": ["7"]})["trace_rate"] == ["7"]
    assert plane.trace_settings()["trace_rate"] == ["1000"]
