"""Triton's ``inference.GRPCInferenceService``: each RPC turns its message into data-plane calls and the
answer back into a message. Nothing here touches a runtime or builds a resource."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from appliance.budget import Account, MemoryBudget
from appliance.engine.model import ModelVersion
from appliance.engine.tensor_checks import DecodeLimits
from appliance.engine.types import InferRequest
from appliance.errors import ApplianceError, InvalidInput, ModelNotFound, NotSupported
from appliance.grpc.access import Access, Gate, is_local_peer
from appliance.grpc.codec import decode_infer_request, encode_infer_response, from_parameters, stream_options
from appliance.grpc.status import abort, abort_unexpected
from appliance.grpc.stream import serve_stream, stream_message
from appliance.protocol.dataplane import SERVER_NAME, DataPlane
from appliance.protocol.log_settings import LogSettings as LogControl
from appliance.protocol.shared_memory import SharedMemoryRegistry
from appliance.protocol.trace_settings import TraceSettings

__all__ = ["InferenceService"]

log = logging.getLogger(__name__)

# Messages above this are decoded on a worker thread, so a big typed tensor never stalls the event loop.
_DECODE_OFF_LOOP_BYTES = 1 << 20

Request = TypeVar("Request")
Response = TypeVar("Response")
Handler = Callable[[Any, Request, grpc.aio.ServicerContext], Awaitable[Response]]


def _rpc(access: Access | Callable[[Any], Access]) -> Callable[[Handler], Handler]:
    """Wrap one unary RPC: check the caller, hold a place among the requests in flight, and map every
    error to its status in one place."""

    def decorate(method: Handler) -> Handler:
        @functools.wraps(method)
        async def handler(self: InferenceService, request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                level = access if isinstance(access, Access) else access(request)
                self._gate.check_caller(context, level)
                with self._gate.admit(level):
                    return await method(self, request, context)
            except ApplianceError as exc:
                error = exc
            except Exception as exc:  # noqa: BLE001 - a bug: answered INTERNAL and logged
                await abort_unexpected(context, method.__name__, exc)
            await abort(context, error)

        return handler

    return decorate


def _changes_settings(request: Any) -> Access:
    """Reading the log or trace settings is like metadata; changing them is control."""
    return Access.CONTROL if request.settings else Access.INFERENCE


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, dataplane: DataPlane, budget: MemoryBudget, limits: DecodeLimits, traces: TraceSettings,
                 logs: LogControl, gate: Gate) -> None:
        self._dataplane = dataplane
        self._budget = budget
        self._limits = limits
        self._traces = traces
        self._logs = logs
        self._gate = gate

    # Health and metadata

    @_rpc(Access.OPEN)
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._dataplane.live())

    @_rpc(Access.OPEN)
    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._dataplane.ready())

    @_rpc(Access.INFERENCE)
    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        try:
            ready = self._dataplane.model_ready(request.name, request.version or None)
        except ModelNotFound:
            ready = False  # as Triton: an unknown model is simply not ready
        return pb.ModelReadyResponse(ready=ready)

    @_rpc(Access.INFERENCE)
    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        metadata = self._dataplane.server_metadata()
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=metadata["version"],
                                         extensions=metadata["extensions"])

    @_rpc(Access.INFERENCE)
    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        metadata = self._dataplane.model_metadata(request.name, request.version or None)
        tensors = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=metadata["name"],
            versions=metadata["versions"],
            platform=metadata["platform"],
            inputs=[tensors(**t) for t in metadata["inputs"]],
            outputs=[tensors(**t) for t in metadata["outputs"]],
        )

    @_rpc(Access.INFERENCE)
    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        return pb.ModelConfigResponse(config=self._dataplane.model(request.name, request.version or None).config)

    @_rpc(Access.INFERENCE)
    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        statistics = self._dataplane.model_statistics(request.name or None, request.version or None)
        # ignore_unknown_fields: appliance-only members (sequence_stats) have no place in Triton's message.
        return json_format.ParseDict(statistics, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)

    # Inference

    async def _decode(self, model: ModelVersion, request: pb.ModelInferRequest, account: Account) -> InferRequest:
        """The message's bytes and what decoding allocates (or reads from shared memory) count against the
        memory budget until the request is answered."""
        size = request.ByteSize()
        account.reserve(size)
        if size > _DECODE_OFF_LOOP_BYTES:
            return await asyncio.to_thread(decode_infer_request, request, self._limits, account.reserve)
        return decode_infer_request(request, self._limits, account.reserve)

    async def infer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> pb.ModelInferResponse:
        """One inference: the model version is held from lookup to response."""
        received_ns = time.monotonic_ns()  # the trace's REQUEST_START
        version = request.model_version or None
        with self._dataplane.model(request.model_name, version).in_use() as model, self._budget.account() as account:
            if model.decoupled:
                raise InvalidInput(
                    "ModelInfer RPC doesn't support models with decoupled transaction policy; call model "
                    f"'{model.name}' through ModelStreamInfer (tritonclient: start_stream and async_stream_infer)"
                )
            decoded = await self._decode(model, request, account)
            stream_options(decoded.parameters)
            local = self._local(context) if decoded.uses_shared_memory else False
            response = await self._dataplane.infer(model, decoded, local=local, reserve=account.reserve,
                                                   received_ns=received_ns)
            return encode_infer_response(response)

    async def stream_responses(self, request: pb.ModelInferRequest,
                               context: grpc.aio.ServicerContext) -> AsyncGenerator[pb.ModelStreamInferResponse, None]:
        """Every response of one request read from a ModelStreamInfer stream (one, unless the model is
        decoupled), each as it is ready."""
        received_ns = time.monotonic_ns()
        version = request.model_version or None
        with self._dataplane.model(request.model_name, version).in_use() as model, self._budget.account() as account:
            decoded = await self._decode(model, request, account)
            empty_final = stream_options(decoded.parameters)
            local = self._local(context) if decoded.uses_shared_memory else False
            responses = await self._dataplane.infer_stream(model, decoded, local=local, reserve=account.reserve,
                                                           release=account.release, received_ns=received_ns)
            try:
                async for item in responses:
                    if item.final:
                        responses.close()  # counted in the statistics before the client sees the end
                    message = stream_message(item, request, empty_final)
                    if message is not None:
                        yield message
            finally:
                responses.close()  # before the final response: the request is cancelled

    def _local(self, context: grpc.aio.ServicerContext) -> bool:
        """Whether the caller runs on this host, for client_shm = local."""
        shared_memory = self._dataplane.shared_memory
        return shared_memory is not None and is_local_peer(context, shared_memory.local_peers)

    @_rpc(Access.INFERENCE)
    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        return await self.infer(request, context)

    async def ModelStreamInfer(self, requests: AsyncIterator[pb.ModelInferRequest],
                               context: grpc.aio.ServicerContext) -> None:
        try:
            self._gate.check_caller(context, Access.INFERENCE)
            self._gate.refuse_if_stopping()
        except ApplianceError as exc:
            await abort(context, exc)
        await serve_stream(requests, context, functools.partial(self.stream_responses, context=context), self._gate)

    # Model repository

    @_rpc(Access.INFERENCE)
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        rows = self._dataplane.repository_index(request.ready)
        index = pb.RepositoryIndexResponse.ModelIndex
        return pb.RepositoryIndexResponse(models=[
            index(name=r["name"], version=r.get("version", ""), state=r["state"], reason=r["reason"]) for r in rows
        ])

    @_rpc(Access.CONTROL)
    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest,
                                  context: Any) -> pb.RepositoryModelLoadResponse:
        await self._dataplane.load_model(request.model_name, from_parameters(request.parameters))
        return pb.RepositoryModelLoadResponse()

    @_rpc(Access.CONTROL)
    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest,
                                    context: Any) -> pb.RepositoryModelUnloadResponse:
        await self._dataplane.unload_model(request.model_name, from_parameters(request.parameters))
        return pb.RepositoryModelUnloadResponse()

    # Shared memory

    def _shared_memory(self) -> SharedMemoryRegistry:
        if self._dataplane.shared_memory is None:
            raise NotSupported("shared memory is not served by this server; send tensors in the request")
        return self._dataplane.shared_memory

    @_rpc(Access.INFERENCE)
    async def SystemSharedMemoryStatus(self, request: pb.SystemSharedMemoryStatusRequest,
                                       context: Any) -> pb.SystemSharedMemoryStatusResponse:
        regions = self._shared_memory().system.status(request.name or None, local=self._local(context))
        return _region_status(pb.SystemSharedMemoryStatusResponse(), regions)

    @_rpc(Access.CONTROL)
    async def SystemSharedMemoryRegister(self, request: pb.SystemSharedMemoryRegisterRequest,
                                         context: Any) -> pb.SystemSharedMemoryRegisterResponse:
        self._shared_memory().system.register(request.name, request.key, request.offset, request.byte_size,
                                              local=self._local(context))
        return pb.SystemSharedMemoryRegisterResponse()

    @_rpc(Access.CONTROL)
    async def SystemSharedMemoryUnregister(self, request: pb.SystemSharedMemoryUnregisterRequest,
                                           context: Any) -> pb.SystemSharedMemoryUnregisterResponse:
        self._shared_memory().system.unregister(request.name or None, local=self._local(context))
        return pb.SystemSharedMemoryUnregisterResponse()

    @_rpc(Access.INFERENCE)
    async def CudaSharedMemoryStatus(self, request: pb.CudaSharedMemoryStatusRequest,
                                     context: Any) -> pb.CudaSharedMemoryStatusResponse:
        regions = self._shared_memory().cuda.status(request.name or None, local=self._local(context))
        return _region_status(pb.CudaSharedMemoryStatusResponse(), regions)

    @_rpc(Access.CONTROL)
    async def CudaSharedMemoryRegister(self, request: pb.CudaSharedMemoryRegisterRequest,
                                       context: Any) -> pb.CudaSharedMemoryRegisterResponse:
        # Off the loop: the first IPC handle a process opens initialises CUDA (a second or more).
        await asyncio.to_thread(self._shared_memory().cuda.register, request.name, request.raw_handle,
                                request.device_id, request.byte_size, local=self._local(context))
        return pb.CudaSharedMemoryRegisterResponse()

    @_rpc(Access.CONTROL)
    async def CudaSharedMemoryUnregister(self, request: pb.CudaSharedMemoryUnregisterRequest,
                                         context: Any) -> pb.CudaSharedMemoryUnregisterResponse:
        await asyncio.to_thread(self._shared_memory().cuda.unregister, request.name or None,
                                local=self._local(context))
        return pb.CudaSharedMemoryUnregisterResponse()

    # Trace and log settings

    @_rpc(_changes_settings)
    async def TraceSetting(self, request: pb.TraceSettingRequest, context: Any) -> pb.TraceSettingResponse:
        model = request.model_name or None
        if model is not None:
            self._dataplane.registry.entry(model)  # NOT_FOUND for a model the repository does not have
        changes = {key: list(setting.value) for key, setting in request.settings.items()}
        values = self._traces.update(changes, model) if changes else self._traces.get(model)
        response = pb.TraceSettingResponse()
        for key, value in values.items():
            response.settings[key].value.extend(value)
        return response

    @_rpc(_changes_settings)
    async def LogSettings(self, request: pb.LogSettingsRequest, context: Any) -> pb.LogSettingsResponse:
        changes: dict[str, object] = {}
        for key, setting in request.settings.items():
            choice = setting.WhichOneof("parameter_choice")
            changes[key] = getattr(setting, choice) if choice is not None else None  # refused by update
        values = self._logs.update(changes) if changes else self._logs.get()
        response = pb.LogSettingsResponse()
        for key, value in values.items():
            if isinstance(value, bool):
                response.settings[key].bool_param = value
            elif isinstance(value, int):
                response.settings[key].uint32_param = value
            else:
                response.settings[key].string_param = value
        return response


def _region_status(response: Any, regions: list[dict[str, Any]]) -> Any:
    """A shared-memory status response (system or CUDA) filled with the registry's regions."""
    for region in regions:
        response.regions[region["name"]].CopyFrom(type(response).RegionStatus(**region))
    return response
