"""Triton's ``inference.GRPCInferenceService``: each RPC turns its message into a data-plane call and the
typed answer back into a message. Admission happened before the message was read
(``appliance.grpc.admission``); nothing here touches a runtime, the registry or shared memory."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from appliance.core.errors import ApplianceError
from appliance.engine.model import ModelVersion
from appliance.engine.scheduler.completion import run_as_task
from appliance.engine.tensor_checks import DecodeLimits
from appliance.engine.types import InferRequest
from appliance.grpc.access import Gate, caller_of
from appliance.grpc.admission import Received, StraightCall, parse_counted, parse_uncounted
from appliance.grpc.codec import (
    decode_infer_request,
    encoding_work,
    from_parameters,
    serialize_infer_response,
    stream_options,
)
from appliance.grpc.grpc_config import StreamRules
from appliance.grpc.known_message import KnownMessage, Planned
from appliance.grpc.status import unexpected
from appliance.grpc.stream import Reply, StreamFailed, serve_stream, stream_message, wants_grpc_errors
from appliance.protocol.admission import Admitted
from appliance.protocol.dataplane import DataPlane
from appliance.protocol.inference import DECODE_OFF_LOOP_BYTES, Flight, Target, decode_off_loop
from appliance.protocol.inflate import InflateLimits
from appliance.protocol.results import InferResult, RegionStatus
from appliance.security.budget import Account

__all__ = ["InferMessage", "InferenceService"]


class InferMessage:
    """A ModelInferRequest as the data plane reads it: parsed here from its bytes (on a worker thread
    when large) unless it comes parsed, then decoded."""

    endpoint = "ModelInfer RPC"
    frontend = "GRPC"
    streaming_alternative = "ModelStreamInfer (tritonclient: start_stream and async_stream_infer)"

    def __init__(self, raw: bytes | None = None, message: pb.ModelInferRequest | None = None,
                 context: grpc.aio.ServicerContext | None = None, known: KnownMessage | None = None) -> None:
        self._context = context
        self._raw = raw
        self.message = message
        self.size = len(raw) if raw is not None else message.ByteSize() if message is not None else 0
        self.empty_final = False
        """Whether the client asked for an empty final response (triton_enable_empty_final_response)."""
        self._known = known
        """Its connection's last message's leading bytes and plan (``appliance.grpc.known_message``): a
        message that starts with them is decoded from the plan; any other teaches it."""
        self._planned: Planned | None = None
        self._target: Target | None = None

    async def target(self, account: Account) -> Target:
        if self.message is None:
            raw, self._raw = self._raw, None
            assert raw is not None
            self.message = await parse_counted(raw, "ModelInfer", pb.ModelInferRequest.FromString, account)
            self._planned = None  # (decoded from the message: ``_raw`` is gone)
        assert self.message is not None
        return Target(self.message.model_name, self.message.model_version or None, _own_timeout(self.message))

    async def receive(self, account: Account) -> int:
        return self.size  # the message was read (and counted) before the call reached the service

    # ReadySource (``Inference.begin``, for a message small enough to parse on the loop)

    def target_now(self) -> Target:
        if self.message is None:  # counted by ``receive_now`` (the raw bytes are on the call's account)
            raw = self._raw
            assert raw is not None
            if self._known is not None:
                planned = self._planned = self._known.match(raw)
                if planned is not None:
                    return planned[0].target
            else:
                self._raw = None
            self.message = parse_uncounted(raw, "ModelInfer", pb.ModelInferRequest.FromString)
        message = self.message
        self._target = Target(message.model_name, message.model_version or None, _own_timeout(message))
        return self._target

    def decoding_work(self) -> int:
        return self.size

    def receive_now(self, account: Account) -> None:
        account.reserve(self.size)  # the parsed message

    def traceparent(self) -> str | None:
        if self._context is None:
            return None
        return next((str(value) for key, value in self._context.invocation_metadata() or ()
                     if key == "traceparent"), None)

    def decode(self, model: ModelVersion, limits: DecodeLimits, reserve: Callable[[int], None]) -> InferRequest:
        planned = self._planned
        if planned is not None:
            plan, chunks = planned
            if plan.request.limits is limits:
                self.empty_final = plan.empty_final
                return plan.decode(chunks, reserve)
            assert self._raw is not None  # (a plan made under other limits: parsed and decoded in full)
            self.message = parse_uncounted(self._raw, "ModelInfer", pb.ModelInferRequest.FromString)
            self._target = plan.target
        assert self.message is not None
        decoded = decode_infer_request(self.message, limits, reserve)
        self.empty_final = stream_options(decoded.parameters)
        if self._known is not None and self._raw is not None and self._target is not None:
            self._known.learn(self._raw, self.message, decoded, self._target, limits, self.empty_final)
        return decoded


async def _serialized(result: InferResult) -> bytes:
    """The ModelInferResponse's bytes: serialised on a worker thread when large."""
    response = result.response
    return await decode_off_loop(encoding_work(response), serialize_infer_response, response)


class _StraightInfer:
    """A ModelInfer call served without a task, from its request's outcome to its answer: serialised in
    the step that has the outcome (on a worker thread when large), what it held let go, the call ended."""

    __slots__ = ("_call", "_admitted")

    def __init__(self, call: StraightCall, admitted: Admitted) -> None:
        self._call = call
        self._admitted = admitted

    def landed(self, flight: Flight, result: InferResult | None, error: BaseException | None) -> None:
        """``DataPlane.begin``'s ``then``."""
        payload = None
        if error is None:
            assert result is not None
            try:
                work = encoding_work(result.response)
                if work > DECODE_OFF_LOOP_BYTES:
                    flight.withdraw = run_as_task(decode_off_loop(work, serialize_infer_response, result.response),
                                                  functools.partial(self._encoded, flight))
                    return
                payload = serialize_infer_response(result.response)
            except Exception as exc:  # noqa: BLE001 - a bug: answered INTERNAL, logged, everything let go
                error = exc
        self._encoded(flight, payload, error)

    def _encoded(self, flight: Flight, payload: bytes | None, error: BaseException | None) -> None:
        flight.end(flight.sent(InferMessage.frontend) if error is None else None)
        self.answered(payload, error)

    def answered(self, payload: bytes | None, error: BaseException | None) -> None:
        """End the call with its answer, or as its error says (the awaited path's too), and let go of the
        admission."""
        try:
            if error is None:
                assert payload is not None
                self._call.answer(payload)
            else:
                self._outcome(error)
        finally:
            self._admitted.__exit__(None, None, None)
            self._call.ended()

    def _outcome(self, error: BaseException) -> None:
        """End the call as ``error`` says: taken back, the appliance's status, or INTERNAL (logged)."""
        if isinstance(error, asyncio.CancelledError):
            self._call.taken_back()
        elif isinstance(error, ApplianceError):
            self._call.refuse(error)
        else:
            self._call.refuse(unexpected("ModelInfer", error))


def _own_timeout(message: pb.ModelInferRequest) -> float | None:
    """Triton's ``timeout`` parameter (microseconds, an int64_param) in seconds: how long the request may
    wait for its model to load on demand; None without a positive one (decoding refuses a malformed one).
    The call's deadline (grpc-timeout) bounds the wait anyway: the call is cancelled at it."""
    if "timeout" not in message.parameters:
        return None
    parameter = message.parameters["timeout"]
    if parameter.WhichOneof("parameter_choice") != "int64_param" or parameter.int64_param <= 0:
        return None
    return parameter.int64_param / 1e6


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, dataplane: DataPlane, gate: Gate, stream_rules: StreamRules, inflation: InflateLimits) -> None:
        self._dataplane = dataplane
        self._gate = gate
        self._stream_rules = stream_rules
        self._inflation = inflation

    # Health and metadata

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._dataplane.live())

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._dataplane.ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self._dataplane.model_ready(request.name, request.version or None))

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        metadata = self._dataplane.server_metadata()
        return pb.ServerMetadataResponse(name=metadata.name, version=metadata.version,
                                         extensions=metadata.extensions)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        metadata = self._dataplane.model_metadata(request.name, request.version or None)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=metadata.name,
            versions=metadata.versions,
            platform=metadata.platform,
            inputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in metadata.inputs],
            outputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in metadata.outputs],
        )

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        return pb.ModelConfigResponse(config=self._dataplane.model_config(request.name, request.version or None))

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        rows = self._dataplane.model_statistics(request.name or None, request.version or None)
        # ignore_unknown_fields: appliance-only members (sequence_stats) have no place in Triton's message.
        return json_format.ParseDict({"model_stats": [row.as_json() for row in rows]}, pb.ModelStatisticsResponse(),
                                     ignore_unknown_fields=True)

    # Inference

    async def ModelInfer(self, request: Received, context: grpc.aio.ServicerContext) -> bytes:
        """One inference; ``request`` is the message's bytes as read (``appliance.grpc.admission``); the
        answer is the ModelInferResponse's bytes, serialised here: on a worker thread when large, as
        requests are parsed."""
        received_ns = time.monotonic_ns()  # the trace's REQUEST_START
        source = InferMessage(request.raw, context=context)
        del request.raw
        if source.size <= DECODE_OFF_LOOP_BYTES:  # (a larger message is parsed on a worker thread)
            answer = await self._straight(request, source, received_ns)
            if answer is not None:
                return answer
        return await self._awaited(request, source, received_ns)

    def begin_infer(self, request: Received, call: StraightCall, admitted: Admitted) -> bool:
        """ModelInfer without a task (``AdmittingHandlers._straight_infer``: the message came whole, small
        enough to parse on the loop): begun on the data plane's straight line and answered in the step
        that has its outcome (``_StraightInfer``); a request the line does not take is served on the
        awaited path by a task. Refusals found in this step raise here. True: the call is taken."""
        received_ns = time.monotonic_ns()
        source = InferMessage(request.raw, context=call, known=request.known)
        request.raw = b""  # the handler drops the bytes once it has parsed them
        serving = _StraightInfer(call, admitted)
        request.account.release(source.size)  # counted once: on the flight's account (``receive_now``)
        flight = self._dataplane.begin(request.caller, source, received_ns, serving.landed)
        if flight is None:  # not the line's: the awaited path, the message parsed already
            request.account.reserve(source.size)
            call.serving(run_as_task(self._awaited(request, source, received_ns), serving.answered))
            return True
        request.account.close()  # (holds nothing now)
        call.serving(flight.cancel)
        return True

    async def _awaited(self, request: Received, source: InferMessage, received_ns: int) -> bytes:
        """The awaited path: the request through the data plane, its answer serialised (``_serialized``)."""
        async with self._dataplane.infer(request.caller, source, received_ns=received_ns,
                                         account=request.account) as result:
            return await _serialized(result)

    async def _straight(self, request: Received, source: InferMessage, received_ns: int) -> bytes | None:
        """The answer on the data plane's straight line (``DataPlane.straight``); None where the line does
        not take the request (the awaited path then serves it, the message parsed already)."""
        request.account.release(source.size)  # counted once: on the flight's account (``receive_now``)
        answer = await self._dataplane.straight(request.caller, source, received_ns, _serialized)
        if answer is None:
            request.account.reserve(source.size)  # back on the call's account, for the awaited path
        return answer

    async def _stream_responses(self, message: pb.ModelInferRequest, account: Account,
                                context: grpc.aio.ServicerContext,
                                grpc_errors: bool) -> AsyncGenerator[Reply, None]:
        """Every response of one request read from a ModelStreamInfer stream (one, unless the model is
        decoupled), each as it is ready; with ``grpc_errors`` (Triton's triton_grpc_error header) a failed
        response ends the stream with its status instead (StreamFailed)."""
        source = InferMessage(message=message, context=context)
        async with self._dataplane.infer_stream(caller_of(context), source, received_ns=time.monotonic_ns(),
                                                account=account) as responses:
            async for item in responses:
                if item.final:
                    responses.close()  # counted in the statistics before the client sees the end
                if grpc_errors and item.error is not None:
                    raise StreamFailed(item.error)
                answer = stream_message(item, message, source.empty_final)
                if answer is not None:
                    yield answer

    async def ModelStreamInfer(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        """The stream was admitted (``appliance.grpc.admission``); its messages come as bytes."""
        grpc_errors = wants_grpc_errors(context)
        await serve_stream(requests, context,
                           lambda message, account: self._stream_responses(message, account, context, grpc_errors),
                           self._gate, self._dataplane, self._stream_rules, self._inflation)

    # Model repository

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        index = pb.RepositoryIndexResponse.ModelIndex
        return pb.RepositoryIndexResponse(models=[
            index(name=row.name, version=row.version or "", state=row.state, reason=row.reason)
            for row in self._dataplane.repository_index(request.ready)
        ])

    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest,
                                  context: Any) -> pb.RepositoryModelLoadResponse:
        await self._dataplane.load_model(request.model_name, from_parameters(request.parameters))
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest,
                                    context: Any) -> pb.RepositoryModelUnloadResponse:
        await self._dataplane.unload_model(request.model_name, from_parameters(request.parameters))
        return pb.RepositoryModelUnloadResponse()

    # Shared memory

    async def SystemSharedMemoryStatus(self, request: pb.SystemSharedMemoryStatusRequest,
                                       context: Any) -> pb.SystemSharedMemoryStatusResponse:
        regions = self._dataplane.shared_memory_status("system", caller_of(context), request.name or None)
        response = pb.SystemSharedMemoryStatusResponse()
        for region in regions:
            response.regions[region.name].CopyFrom(response.RegionStatus(
                name=region.name, key=region.key or "", offset=region.offset or 0, byte_size=region.byte_size))
        return response

    async def SystemSharedMemoryRegister(self, request: pb.SystemSharedMemoryRegisterRequest,
                                         context: Any) -> pb.SystemSharedMemoryRegisterResponse:
        self._dataplane.register_system_shared_memory(caller_of(context), request.name, request.key, request.offset,
                                                      request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request: pb.SystemSharedMemoryUnregisterRequest,
                                           context: Any) -> pb.SystemSharedMemoryUnregisterResponse:
        await self._dataplane.unregister_shared_memory("system", caller_of(context), request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request: pb.CudaSharedMemoryStatusRequest,
                                     context: Any) -> pb.CudaSharedMemoryStatusResponse:
        regions = self._dataplane.shared_memory_status("cuda", caller_of(context), request.name or None)
        return _cuda_status(regions)

    async def CudaSharedMemoryRegister(self, request: pb.CudaSharedMemoryRegisterRequest,
                                       context: Any) -> pb.CudaSharedMemoryRegisterResponse:
        await self._dataplane.register_cuda_shared_memory(caller_of(context), request.name, request.raw_handle,
                                                          request.device_id, request.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(self, request: pb.CudaSharedMemoryUnregisterRequest,
                                         context: Any) -> pb.CudaSharedMemoryUnregisterResponse:
        await self._dataplane.unregister_shared_memory("cuda", caller_of(context), request.name or None)
        return pb.CudaSharedMemoryUnregisterResponse()

    # Trace and log settings

    async def TraceSetting(self, request: pb.TraceSettingRequest, context: Any) -> pb.TraceSettingResponse:
        changes = {key: list(setting.value) for key, setting in request.settings.items()}
        values = self._dataplane.trace_settings(request.model_name or None, changes)
        response = pb.TraceSettingResponse()
        for key, value in values.items():
            response.settings[key].value.extend(value)
        return response

    async def LogSettings(self, request: pb.LogSettingsRequest, context: Any) -> pb.LogSettingsResponse:
        changes: dict[str, object] = {}
        for key, setting in request.settings.items():
            choice = setting.WhichOneof("parameter_choice")
            changes[key] = getattr(setting, choice) if choice is not None else None  # refused by the data plane
        values = self._dataplane.log_settings(changes)
        response = pb.LogSettingsResponse()
        for key, value in values.items():
            if isinstance(value, bool):
                response.settings[key].bool_param = value
            elif isinstance(value, int):
                response.settings[key].uint32_param = value
            else:
                response.settings[key].string_param = value
        return response


def _cuda_status(regions: list[RegionStatus]) -> pb.CudaSharedMemoryStatusResponse:
    response = pb.CudaSharedMemoryStatusResponse()
    for region in regions:
        response.regions[region.name].CopyFrom(response.RegionStatus(
            name=region.name, device_id=region.device_id or 0, byte_size=region.byte_size))
    return response
