"""Raw gRPC helpers for tests (and benches) that send what no well-behaved client sends: oversized
messages, idle connections, many calls at once."""

from __future__ import annotations

import grpc
from tritonclient.grpc import service_pb2 as pb

__all__ = ["MODEL_INFER", "MODEL_STREAM_INFER", "PREFACE", "bomb", "channel", "codes"]

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
MODEL_STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""The HTTP/2 client preface and an empty SETTINGS frame: what an idle gRPC connection sends."""


def channel(port: int) -> grpc.Channel:
    """A channel to 127.0.0.1:``port`` without the client's own message size limits."""
    return grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", -1),
                                                                ("grpc.max_receive_message_length", -1)])


def bomb(model: str, size: int, **parameters: int) -> bytes:
    """A ModelInferRequest of ``size`` bytes: one small input with ``size`` bytes of raw contents."""
    request = pb.ModelInferRequest(model_name=model, inputs=[pb.ModelInferRequest.InferInputTensor(
        name="INPUT0", datatype="INT32", shape=[1, 16])], raw_input_contents=[bytes(size)])
    for key, value in parameters.items():
        request.parameters[key].int64_param = value
    return request.SerializeToString()


def codes(futures: list) -> list[str]:
    """The status code name of each call ("OK" for an answer), in order."""
    found = []
    for future in futures:
        try:
            future.result()
            found.append("OK")
        except grpc.RpcError as error:
            found.append(error.code().name)
    return found
