"""Inference through the data plane, below every transport: what a request gets back (the outputs it asks
for, its id, the version it names or the model's latest, the classification extension's top classes) and
a decoupled model's responses as ``infer_stream`` hands them out (in order, an error response as an item
while the stream goes on, a model that answers once as a stream of one, leaving early cancelling the
request). Each transport's tests check only that their wire form reaches these."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from appliance.backends import RuntimeOptions
from appliance.core.errors import ModelNotFound
from appliance.engine.types import InferInput, InferRequest, RequestedOutput
from appliance.examples import mlp_model
from appliance.protocol.dataplane import DataPlane
from appliance.repository.registry import ModelRegistry
from tests.appliance.protocol.sources import LOCAL, Decoded
from tests.builders import affine_model, two_output_model, write_model
from tests.models.decoupled import build_streaming_repository
from tests.waiting import await_until


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("inference")
    write_model(repo, "mlp", mlp_model(seed=3))
    write_model(repo, "two_outputs", two_output_model())
    for version in (1, 2, 3):
        write_model(repo, "affine", affine_model(scale=version, offset=10 * version), version=version,
                    config="version_policy: { all { } }\n")
    for version in (1, 2):
        write_model(repo, "affine_latest", affine_model(scale=version, offset=0), version=version)
    return repo


@pytest.fixture
async def plane(repository):
    registry = ModelRegistry(repository, RuntimeOptions())
    await registry.load_all()
    yield DataPlane(registry)
    await registry.close(5)


async def _infer(plane: DataPlane, model: str, inputs: dict[str, np.ndarray], outputs: tuple = (),
                 version: str | None = None, request_id: str | None = None):
    request = InferRequest([InferInput(name, "FP32", data) for name, data in inputs.items()],
                           [RequestedOutput(name, dict(parameters)) for name, parameters in outputs], id=request_id)
    async with plane.infer(LOCAL, Decoded(model, request, version)) as result:
        return result.response


async def test_only_the_requested_outputs_come_back_with_the_requests_id(plane):
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    response = await _infer(plane, "two_outputs", {"x": x}, outputs=(("square", {}),), request_id="req-42")
    assert response.id == "req-42" and [output.name for output in response.outputs] == ["square"]
    np.testing.assert_array_equal(response.outputs[0].data, x * x)
    everything = await _infer(plane, "two_outputs", {"x": x})
    assert {output.name: output.data.tolist() for output in everything.outputs} == {
        "double": (x + x).tolist(), "square": (x * x).tolist()}


async def test_a_request_runs_the_version_it_names_else_the_latest(plane):
    x = np.ones((1, 8), np.float32)
    for version in (1, 2, 3):
        response = await _infer(plane, "affine", {"x": x}, version=str(version))
        assert response.model_version == version
        np.testing.assert_allclose(response.outputs[0].data, x * version + 10 * version)
    assert (await _infer(plane, "affine", {"x": x})).model_version == 3
    # The default version policy (latest 1) serves only the newest version.
    assert (await _infer(plane, "affine_latest", {"x": x})).model_version == 2
    with pytest.raises(ModelNotFound, match="version 1 is not found"):
        await _infer(plane, "affine_latest", {"x": x}, version="1")


async def test_classification_answers_the_top_classes_as_value_and_index(plane, repository):
    x = np.random.default_rng(7).standard_normal((2, 784)).astype(np.float32)
    response = await _infer(plane, "mlp", {"input": x}, outputs=(("probabilities", {"classification": 3}),))
    top = response.outputs[0]
    assert top.datatype == "BYTES" and top.data.shape == (2, 3)
    session = ort.InferenceSession(str(repository / "mlp" / "1" / "model.onnx"))
    (probabilities,) = session.run(["probabilities"], {"input": x})
    for row, classes in zip(probabilities, top.data):
        values = [item.decode().split(":") for item in classes]
        assert [int(index) for _, index in values] == list(np.argsort(-row)[:3])
        np.testing.assert_allclose([float(value) for value, _ in values], np.sort(row)[::-1][:3], rtol=1e-5)


@pytest.fixture(scope="module")
def streaming(tmp_path_factory):
    return build_streaming_repository(tmp_path_factory.mktemp("streaming") / "repo")


@pytest.fixture
async def stream_plane(streaming):
    registry = ModelRegistry(streaming, RuntimeOptions())
    await registry.load_all(["simple", "repeat", "endless"])
    yield DataPlane(registry)
    await registry.close(5)


def _ints(name: str, values: list[int]) -> InferInput:
    return InferInput(name, "INT32", np.array(values, np.int32))


async def _stream(plane: DataPlane, model: str, *inputs: InferInput, request_id: str = "s") -> list:
    async with plane.infer_stream(LOCAL, Decoded(model, InferRequest(list(inputs), id=request_id))) as responses:
        return [item async for item in responses]


async def test_a_decoupled_models_responses_come_in_order_an_error_among_them_and_the_last_one_final(stream_plane):
    items = await _stream(stream_plane, "repeat", _ints("IN", [4, -1, 6]))
    assert [item.final for item in items] == [False, False, False, True]
    first, error, third, last = items
    assert {o.name: o.data.tolist() for o in first.response.outputs} == {"OUT": [4], "IDX": [0]}
    assert error.response is None and "negative value at 1" in str(error.error)  # and the stream goes on
    assert {o.name: o.data.tolist() for o in third.response.outputs} == {"OUT": [6], "IDX": [2]}
    assert last.error is None and (last.response is None or not last.response.outputs)
    assert all(item.response is None or item.response.id == "s" for item in items)


async def test_a_model_that_answers_once_is_a_stream_of_one_final_response(stream_plane):
    x = _ints("INPUT0", list(range(16)))
    x.data = x.data.reshape(1, 16)
    ones = _ints("INPUT1", [1] * 16)
    ones.data = ones.data.reshape(1, 16)
    (item,) = await _stream(stream_plane, "simple", x, ones)
    assert item.final and item.error is None
    assert {o.name: o.data.tolist() for o in item.response.outputs}["OUTPUT0"] == [[v + 1 for v in range(16)]]


async def test_leaving_a_stream_early_cancels_the_request(stream_plane, streaming):
    marker = streaming / "endless" / "cancelled.txt"
    async with stream_plane.infer_stream(LOCAL, Decoded("endless", InferRequest([_ints("IN", [1])], id="left"))) \
            as responses:
        read = 0
        async for item in responses:
            assert item.error is None
            read += 1
            if read == 3:
                break
    await await_until(lambda: marker.exists() and "left" in marker.read_text(), timeout=30,
                      what="the model to see request.is_cancelled()", interval=0.05)


def test_a_join_of_views_is_the_plain_join_copied_out_in_chunks():
    """Both encoders answer through it: a large binary answer must be the same bytes b"".join makes."""
    import numpy as np

    from appliance.protocol.inference import join_releasing_gil

    big = np.arange((3 << 20) // 4 + 5, dtype=np.float32)
    pieces = [b"{head}", memoryview(big).cast("B"), b"", memoryview(b"tail")]
    joined = join_releasing_gil(pieces)
    assert isinstance(joined, bytes) and joined == b"".join(pieces)
    assert join_releasing_gil([]) == b""
