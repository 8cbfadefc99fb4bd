"""OpenTelemetry traces end to end: a daemon started with Triton's --trace-config mode=opentelemetry sends
its spans over OTLP/HTTP to a small receiver here, which decodes them with OpenTelemetry's own protobuf
messages; checked as NVIDIA's qa/L0_trace/opentelemetry_unittest.py checks Triton's (span names, events,
parent links, resource attributes, W3C traceparent propagation over HTTP and gRPC)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.builders import identity_model, write_model
from tests.waiting import wait_until

TRACEPARENT = "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01"
ROOT_HTTP = ["HTTP_RECV_START", "HTTP_RECV_END", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END"]
ROOT_GRPC = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE", "GRPC_SEND_START",
             "GRPC_SEND_END"]
MODEL = ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
COMPUTE = ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]


class Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1: every span it was sent, with its resource's attributes."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, str], object]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                assert self.path == "/v1/traces" and self.headers["Content-Type"] == "application/x-protobuf"
                request = ExportTraceServiceRequest.FromString(body)
                with receiver.lock:
                    for resource_spans in request.resource_spans:
                        resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                        for scope in resource_spans.scope_spans:
                            receiver.spans.extend((resource, span) for span in scope.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def trace(self, trace_id: bytes | None = None, count: int = 3) -> list:
        """The spans of one trace (the newest, or ``trace_id``'s) once ``count`` of them came."""
        def came() -> list | None:
            with self.lock:
                spans = [span for _, span in self.spans]
            if spans:
                wanted = trace_id or spans[-1].trace_id
                mine = [span for span in spans if span.trace_id == wanted]
                if len(mine) >= count:
                    return mine
            return None

        return wait_until(came, timeout=15, what=f"{count} spans of one trace", interval=0.05)

    def clear(self) -> None:
        with self.lock:
            self.spans.clear()


@pytest.fixture(scope="module")
def receiver():
    running = Receiver()
    yield running
    running.server.shutdown()
    running.server.server_close()


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "simple", identity_model(["FP32"]))
    return repo


@pytest.fixture(scope="module")
def daemon(module_daemon, repository, receiver):
    return module_daemon(repository, "--trace-config", "mode=opentelemetry", "--trace-config", "rate=1",
                         "--trace-config", "level=TIMESTAMPS", "--trace-config", "count=-1",
                         "--trace-config", f"opentelemetry,url=127.0.0.1:{receiver.port}/v1/traces",
                         "--trace-config", "opentelemetry,resource=test.key=test.value",
                         "--trace-config", "opentelemetry,resource=service.name=test_triton",
                         "--trace-config", "opentelemetry,bsp_schedule_delay=50")


def _infer(client, headers: dict | None = None) -> None:
    module = triton_grpc if isinstance(client, triton_grpc.InferenceServerClient) else triton
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    tensor = module.InferInput("IN_FP32", [2, 4], "FP32")
    tensor.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer("simple", [tensor], headers=headers).as_numpy("OUT_FP32"), data)


def _check(spans: list, root_events: list[str], headers: dict | None) -> None:
    by_name = {span.name: span for span in spans}
    assert sorted(by_name) == ["InferRequest", "compute", "simple"] and len(spans) == 3
    root, model, compute = by_name["InferRequest"], by_name["simple"], by_name["compute"]
    assert model.parent_span_id == root.span_id and compute.parent_span_id == model.span_id
    assert [event.name for event in root.events] == root_events
    assert [event.name for event in model.events] == MODEL
    assert [event.name for event in compute.events] == COMPUTE
    for span in spans:  # events within their span, spans within their parent
        assert span.start_time_unix_nano <= span.end_time_unix_nano
        assert all(span.start_time_unix_nano <= e.time_unix_nano <= span.end_time_unix_nano for e in span.events)
    assert root.start_time_unix_nano <= model.start_time_unix_nano <= compute.start_time_unix_nano
    assert abs(root.start_time_unix_nano / 1e9 - time.time()) < 60  # the wall clock, not the monotonic one
    attributes = {a.key: a.value for a in model.attributes}
    assert attributes["triton.model_name"].string_value == "simple"
    assert attributes["triton.model_version"].int_value == 1
    if headers is None:
        assert root.parent_span_id == b""
    else:
        _, trace_id, span_id, _ = headers["traceparent"].split("-")
        assert root.trace_id.hex() == trace_id and root.parent_span_id.hex() == span_id


@pytest.mark.parametrize("headers", [None, {"traceparent": TRACEPARENT}], ids=["root", "propagated"])
def test_http_requests_are_exported_as_tritons_spans(daemon, receiver, headers):
    receiver.clear()
    with triton.InferenceServerClient(daemon.url) as client:
        _infer(client, headers)
    spans = receiver.trace(bytes.fromhex(TRACEPARENT.split("-")[1]) if headers else None)
    _check(spans, ROOT_HTTP, headers)
    resource = next(resource for resource, span in receiver.spans if span is spans[0])
    assert resource["service.name"] == "test_triton" and resource["test.key"] == "test.value"


@pytest.mark.parametrize("headers", [None, {"traceparent": TRACEPARENT}], ids=["root", "propagated"])
def test_grpc_requests_are_exported_as_tritons_spans(daemon, receiver, headers):
    receiver.clear()
    client = triton_grpc.InferenceServerClient(daemon.grpc_url)
    _infer(client, headers)
    _check(receiver.trace(bytes.fromhex(TRACEPARENT.split("-")[1]) if headers else None), ROOT_GRPC, headers)


def test_a_propagated_context_is_traced_whatever_the_rate(start_daemon, repository, receiver):
    quiet = start_daemon(repository, "--trace-config", "mode=opentelemetry", "--trace-config", "rate=0",
                         "--trace-config", "level=TIMESTAMPS",
                         "--trace-config", f"opentelemetry,url=http://127.0.0.1:{receiver.port}/v1/traces",
                         "--trace-config", "opentelemetry,bsp_schedule_delay=50")
    receiver.clear()
    with triton.InferenceServerClient(quiet.url) as client:
        _infer(client)  # rate 0: not traced
        _infer(client, {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
        _infer(client, {"traceparent": "not-a-trace-context"})  # ignored, as W3C says: not traced either
        # Traced last: the exporter sends traces in the order they ended, so the untraced requests' spans, had
        # they been made, would have come by the time this one's have.
        _infer(client, {"traceparent": "00-" + "3" * 32 + "-" + "4" * 16 + "-01"})
    spans = receiver.trace(bytes.fromhex("1" * 32))
    receiver.trace(bytes.fromhex("3" * 32))
    assert len(receiver.spans) == 6 and spans[0].trace_id == bytes.fromhex("1" * 32)


def test_a_traceparent_over_trace_client_rate_is_sampled_like_any_request(start_daemon, repository, receiver):
    """trace_client_rate 0: a traceparent forces no trace; the request is sampled by trace_rate (here the
    second one) and, when it is, continues the caller's trace."""
    capped = start_daemon(repository, "--trace-config", "mode=opentelemetry", "--trace-config", "rate=2",
                          "--trace-config", "level=TIMESTAMPS",
                          "--trace-config", f"opentelemetry,url=http://127.0.0.1:{receiver.port}/v1/traces",
                          "--trace-config", "opentelemetry,bsp_schedule_delay=50",
                          env={"APPLIANCE_TRACE_CLIENT_RATE": "0"})
    receiver.clear()
    with triton.InferenceServerClient(capped.url) as client:
        _infer(client, {"traceparent": "00-" + "5" * 32 + "-" + "6" * 16 + "-01"})  # the first: not sampled
        _infer(client, {"traceparent": "00-" + "7" * 32 + "-" + "8" * 16 + "-01"})  # the second: sampled
    spans = receiver.trace(bytes.fromhex("7" * 32))
    root = next(span for span in spans if span.name == "InferRequest")
    assert root.parent_span_id == bytes.fromhex("8" * 16)
    assert len(receiver.spans) == 3  # the first request's spans would have come before these


def test_a_receiver_that_is_down_costs_requests_nothing(start_daemon, repository):
    lonely = start_daemon(repository, "--trace-config", "mode=opentelemetry", "--trace-config", "rate=1",
                          "--trace-config", "level=TIMESTAMPS",
                          "--trace-config", "opentelemetry,url=http://127.0.0.1:9/v1/traces",
                          "--trace-config", "opentelemetry,bsp_schedule_delay=10")
    started = time.monotonic()
    with triton.InferenceServerClient(lonely.url) as client:
        for _ in range(20):
            _infer(client)
    assert time.monotonic() - started < 10
    stopping = time.monotonic()
    assert lonely.stop() == 0  # and it stops, its exporter with it,
    assert time.monotonic() - stopping < 8  # without waiting out the exports' 10 s of retries
