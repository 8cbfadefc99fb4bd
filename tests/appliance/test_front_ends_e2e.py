"""One end-to-end suite for every supported front-end path (docs/architecture.md, "Supported combinations"):
HTTP through the infer lane and through aiohttp, gRPC on the appliance's own HTTP/2 transport, a Python
model in a process of its own and in the daemon. Three daemons cover them: the default (lane, a process per
instance), aiohttp alone (``http_infer_lane = false``), and the default front ends with the identity model
on the in-process plan (allowed and pinned by its config, chosen by selection); each test runs on all
three, over HTTP or gRPC.

Each path must answer the same: inference in JSON and binary, BYTES, a decoupled model's stream, Triton's
refusals (unknown model, wrong shape), model metadata, and the statistics every path records."""

from __future__ import annotations

import dataclasses
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.models import copy_model


@dataclasses.dataclass(frozen=True)
class FrontEndPath:
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    in_process: bool = False
    """The identity model allowed and pinned to the in-process plan, the daemon measuring (selection on)."""


PATHS = {
    "lane+own-http2": FrontEndPath(),
    "aiohttp+own-http2": FrontEndPath({"APPLIANCE_HTTP_INFER_LANE": "false"}),
    "lane+own-http2+in-process": FrontEndPath(in_process=True),
}


def _repository(root, in_process: bool):
    copy_model(root, "front_ends/identity", config="in_process" if in_process else "config")
    copy_model(root, "decoupled/repeat")
    return root


@pytest.fixture(scope="module", params=sorted(PATHS))
def box(request, module_daemon, tmp_path_factory):
    path = PATHS[request.param]
    daemon = module_daemon(_repository(tmp_path_factory.mktemp("front-ends"), path.in_process), env=path.env,
                           selection=path.in_process)
    daemon.path = path
    return daemon


@pytest.fixture(params=["http", "grpc"])
def protocol(request) -> str:
    return request.param


class Client:
    """tritonclient over one protocol, with what the suite sends built for it."""

    def __init__(self, box, protocol: str) -> None:
        self.protocol = protocol
        self.module = httpclient if protocol == "http" else grpcclient
        self.client = (httpclient.InferenceServerClient(box.url) if protocol == "http"
                       else grpcclient.InferenceServerClient(box.grpc_url))

    def inputs(self, values: np.ndarray, words: list[bytes], binary: bool = True) -> list:
        first = self.module.InferInput("INPUT0", list(values.shape), "FP32")
        second = self.module.InferInput("INPUT1", [1, len(words)], "BYTES")
        if self.protocol == "http":
            first.set_data_from_numpy(values, binary_data=binary)
            second.set_data_from_numpy(np.array([words], dtype=np.object_), binary_data=binary)
        else:
            first.set_data_from_numpy(values)
            second.set_data_from_numpy(np.array([words], dtype=np.object_))
        return [first, second]

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def client(box, protocol):
    made = Client(box, protocol)
    yield made
    made.close()


def test_inference(client):
    values = np.arange(3, dtype=np.float32).reshape(1, 3)
    words = [b"edge", b"\x00\xffbytes"]
    result = client.client.infer("identity", client.inputs(values, words))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)
    assert result.as_numpy("OUTPUT1").tolist() == [words]


def test_json_inference_over_http(box):
    json_client = Client(box, "http")
    try:
        values = np.arange(3, dtype=np.float32).reshape(1, 3)
        asked = [httpclient.InferRequestedOutput(name, binary_data=False) for name in ("OUTPUT0", "OUTPUT1")]
        result = json_client.client.infer("identity", json_client.inputs(values, [b"edge", b"json"], binary=False),
                                          outputs=asked)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)
        assert result.get_response()["outputs"][0]["data"] == [0.0, 1.0, 2.0]  # answered in JSON, as asked
        assert result.get_response()["outputs"][1]["data"] == ["edge", "json"]
    finally:
        json_client.close()


def test_refusals_in_tritons_words(client):
    inputs = client.inputs(np.zeros((1, 2), np.float32), [b"x"])
    with pytest.raises(InferenceServerException) as missing:
        client.client.infer("no_such_model", inputs)
    assert "Request for unknown model: 'no_such_model' is not found" in missing.value.message()
    wrong = client.module.InferInput("INPUT0", [1, 2, 2], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 2, 2), np.float32))
    with pytest.raises(InferenceServerException) as shape:
        client.client.infer("identity", [wrong, inputs[1]])
    assert "unexpected shape for input 'INPUT0' for model 'identity'" in shape.value.message()
    assert client.client.is_server_live()


def test_metadata(client):
    metadata = client.client.get_model_metadata("identity")
    names = ([i["name"] for i in metadata["inputs"]] if client.protocol == "http"
             else [i.name for i in metadata.inputs])
    assert names == ["INPUT0", "INPUT1"]


def test_a_decoupled_models_stream(box, client):
    if client.protocol == "http":
        # HTTP streams a decoupled model through generate_stream (server-sent events).
        import json
        import urllib.request

        request = urllib.request.Request(f"{box.base}/v2/models/repeat/generate_stream",
                                         data=json.dumps({"IN": [3, 4, 5]}).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            events = [json.loads(line[5:]) for line in response.read().decode().splitlines()
                      if line.startswith("data:")]
        assert [event["OUT"] for event in events] == [3, 4, 5]
        return
    answers: queue.Queue = queue.Queue()
    tensor = grpcclient.InferInput("IN", [3], "INT32")
    tensor.set_data_from_numpy(np.array([3, 4, 5], np.int32))
    client.client.start_stream(callback=lambda result, error: answers.put((result, error)))
    client.client.async_stream_infer("repeat", [tensor])
    received = [answers.get(timeout=30) for _ in range(3)]
    client.client.stop_stream()
    assert [error for _, error in received] == [None, None, None]
    assert [result.as_numpy("OUT").tolist() for result, _ in received] == [[3], [4], [5]]


def test_every_path_records_statistics(client):
    def successes() -> int:
        stats = client.client.get_inference_statistics("identity")
        if client.protocol == "http":
            return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])
        return int(stats.model_stats[0].inference_stats.success.count)

    before = successes()
    client.client.infer("identity", client.inputs(np.ones((1, 2), np.float32), [b"a"]))
    assert successes() == before + 1


def test_the_model_runs_where_the_path_says(box, client):
    result = client.client.infer("identity", client.inputs(np.ones((1, 2), np.float32), [b"a"]))
    parameters = (result.get_response()["parameters"] if client.protocol == "http"
                  else {k: v.int64_param for k, v in result.get_response().parameters.items()})
    assert (int(parameters["pid"]) == box.process.pid) is box.path.in_process
