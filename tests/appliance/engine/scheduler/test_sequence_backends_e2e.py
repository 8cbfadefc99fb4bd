"""The sequence batcher on every runtime that batches: the VAD-like recurrent model with implicit state
served by onnxruntime, OpenVINO, TorchScript and torch.export, concurrent streams checked against a numpy
loop that carries the state by hand."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import numpy_helper

from appliance.examples.sequence import FRAME, vad_config, vad_state_model, write_sequence_model

torch = pytest.importorskip("torch")
pytest.importorskip("openvino")

STREAMS, STEPS = 6, 10


def _weights() -> np.ndarray:
    model = vad_state_model()
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == "w")


class _Vad(torch.nn.Module):
    def __init__(self, weights: np.ndarray) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.from_numpy(weights.copy()), requires_grad=False)

    def forward(self, input: torch.Tensor, state: torch.Tensor):  # noqa: A002 - the model's input name
        drive = (input @ self.w).reshape(-1, 2, 128)
        state_n = torch.tanh(0.9 * state + 0.1 * drive)
        return torch.sigmoid(state_n.mean(dim=(1, 2))).unsqueeze(1), state_n


_TORCH_STATE = """
max_batch_size: 16
sequence_batching {{
  {strategy}
  state [ {{ input_name: "state" output_name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 2, 128 ]
            initial_state {{ data_type: TYPE_FP32 dims: [ 2, 128 ] zero_data: true name: "silence" }} }} ]
}}
"""
_TORCHSCRIPT_IO = """
input [ { name: "input" data_type: TYPE_FP32 dims: [ 512 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("sequence-backends")
    write_sequence_model(repo, "vad_onnx", vad_state_model(), vad_config("direct { }", max_batch_size=16))
    ov_dir = write_sequence_model(repo, "vad_openvino", vad_state_model(),
                                  'backend: "openvino"\ndefault_model_filename: "model.onnx"\n'
                                  + vad_config("oldest { max_candidate_sequences: 8 }", max_batch_size=16))
    assert ov_dir.exists()
    net = _Vad(_weights()).eval()
    example = (torch.randn(2, FRAME), torch.zeros(2, 2, 128))
    script = repo / "vad_torchscript"
    (script / "1").mkdir(parents=True)
    torch.jit.trace(net, example).save(str(script / "1" / "model.pt"))
    (script / "config.pbtxt").write_text('platform: "pytorch_libtorch"\n' + _TORCH_STATE.format(strategy="direct { }")
                                         + _TORCHSCRIPT_IO)
    export = repo / "vad_export"
    (export / "1").mkdir(parents=True)
    batch = torch.export.Dim("batch", max=64)
    program = torch.export.export(net, example, dynamic_shapes=({0: batch}, {0: batch}))
    torch.export.save(program, str(export / "1" / "model.pt2"))
    (export / "config.pbtxt").write_text(_TORCH_STATE.format(strategy="oldest { max_candidate_sequences: 8 }"))
    return repo


def _reference(frames: np.ndarray) -> np.ndarray:
    weights = _weights().astype(np.float64)
    state, probs = np.zeros((2, 128)), []
    for frame in frames.astype(np.float64):
        state = np.tanh(0.9 * state + 0.1 * (frame @ weights).reshape(2, 128))
        probs.append(1 / (1 + np.exp(-state.mean())))
    return np.array(probs)


def _stream(port: int, model: str, output: str, name: str, frames: np.ndarray) -> np.ndarray:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        probs = []
        for step, frame in enumerate(frames):
            tensor = grpcclient.InferInput("input", [1, FRAME], "FP32")
            tensor.set_data_from_numpy(frame[None])
            result = client.infer(model, [tensor], sequence_id=name, sequence_start=step == 0,
                                  sequence_end=step == len(frames) - 1)
            probs.append(result.as_numpy(output)[0, 0])
        return np.array(probs)
    finally:
        client.close()


@pytest.mark.parametrize("model, output", [("vad_onnx", "prob"), ("vad_openvino", "prob"),
                                           ("vad_torchscript", "OUTPUT__0"), ("vad_export", "OUTPUT__0")])
def test_concurrent_streams_carry_their_state_on_every_runtime(daemon, model, output):
    rng = np.random.default_rng(11)
    streams = {f"{model}-{i}": rng.standard_normal((STEPS, FRAME)).astype(np.float32) for i in range(STREAMS)}
    port = daemon.grpc_port
    with ThreadPoolExecutor(STREAMS) as pool:
        got = dict(zip(streams, pool.map(lambda n: _stream(port, model, output, n, streams[n]), streams)))
    for name, frames in streams.items():
        np.testing.assert_allclose(got[name], _reference(frames), rtol=1e-4, atol=1e-6, err_msg=name)
