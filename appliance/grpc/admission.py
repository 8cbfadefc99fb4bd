"""Admission before a byte is read: every RPC of the service is served by a handler that admits it first.

A server that reads a unary call's whole message before it calls the handler checks a token too late
(under grpc.aio ten unauthenticated 200 MiB calls were all read, and parsed, before each was refused).
So every unary RPC is served as one that reads its message itself, after:

1. admission through the data plane: the caller's ``authorization`` metadata and address decide the
   token (``appliance.protocol.operations.ACCESS``), then the bound on requests in flight, which every
   RPC counts in, ServerLive and ServerReady too (each costs a stream and a handler);
2. receiving (``appliance.grpc.receive``): in a receive slot where the message may be large, at a
   minimum rate.

ServerLive and ServerReady read nothing: their message has no fields, and a health check must never wait
for a client's bytes (or for a receive slot). Once read, the message's bytes count on the request's
account of the memory budget; a compressed one is inflated on that account
(``appliance.protocol.inflate``: each step reserved before it is allocated, within max_request_bytes and
max_inflation_ratio, on a worker thread), and it is parsed on a worker thread when it is large (above
``DECODE_OFF_LOOP_BYTES``); a message that is not the protobuf it should be is INVALID_ARGUMENT.
ModelInfer gets the raw bytes and its account (``Received``, with its caller): the data plane parses it,
counted there. ModelStreamInfer is admitted as a stream (``appliance.grpc.stream``). The standard health
service's Check and Watch (``appliance.grpc.health``) are admitted as ServerReady and read their one
message as any unary RPC does; Watch then answers with a stream.

``AdmittingHandlers`` makes the admitting handler of every RPC once, when the server is built: finding a
call's handler (``by_path``) is a dictionary lookup.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, cast

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from appliance.core.errors import ApplianceError, InvalidInput
from appliance.grpc.access import Gate, caller_of
from appliance.grpc.health import SERVICE as HEALTH_SERVICE
from appliance.grpc.health import HealthCheckRequest, HealthCheckResponse, HealthService
from appliance.grpc.http2.headers import Request
from appliance.grpc.known_message import KnownMessage
from appliance.grpc.receive import Metered, Receivers
from appliance.grpc.status import abort, abort_unexpected, unexpected
from appliance.protocol.admission import Caller
from appliance.protocol.dataplane import DataPlane
from appliance.protocol.inference import DECODE_OFF_LOOP_BYTES, decode_off_loop
from appliance.protocol.inflate import Compressed, InflateLimits, inflate_off_loop
from appliance.protocol.operations import Operation
from appliance.security.budget import Account

__all__ = ["OPERATIONS", "AdmittingHandlers", "Received", "Receivers", "Straight", "StraightCall", "inflated", "parse",
           "parse_uncounted"]


_SERVICE_NAME = "inference.GRPCInferenceService"
OPERATIONS: dict[str, Operation] = {
    "ServerLive": Operation.SERVER_LIVE,
    "ServerReady": Operation.SERVER_READY,
    "ModelReady": Operation.MODEL_READY,
    "ServerMetadata": Operation.SERVER_METADATA,
    "ModelMetadata": Operation.MODEL_METADATA,
    "ModelConfig": Operation.MODEL_CONFIG,
    "ModelStatistics": Operation.MODEL_STATISTICS,
    "ModelInfer": Operation.INFER,
    "ModelStreamInfer": Operation.INFER_STREAM,
    "RepositoryIndex": Operation.REPOSITORY_INDEX,
    "RepositoryModelLoad": Operation.MODEL_LOAD,
    "RepositoryModelUnload": Operation.MODEL_UNLOAD,
    "SystemSharedMemoryStatus": Operation.SHM_STATUS,
    "SystemSharedMemoryRegister": Operation.SHM_REGISTER,
    "SystemSharedMemoryUnregister": Operation.SHM_UNREGISTER,
    "CudaSharedMemoryStatus": Operation.SHM_STATUS,
    "CudaSharedMemoryRegister": Operation.SHM_REGISTER,
    "CudaSharedMemoryUnregister": Operation.SHM_UNREGISTER,
    "TraceSetting": Operation.TRACE_SETTINGS,
    "LogSettings": Operation.LOG_SETTINGS,
}
"""The data-plane operation of each RPC (reading settings; a request that changes them is the
operation's *_UPDATE, decided once the message is read)."""

_METHODS = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name
_UPDATES = {Operation.TRACE_SETTINGS: Operation.TRACE_UPDATE, Operation.LOG_SETTINGS: Operation.LOG_UPDATE}
_RAW = frozenset({"ModelInfer", "ModelStreamInfer"})
"""RPCs whose handler takes the message's bytes (``Received``; ModelStreamInfer: each message's) and parses
them itself, on its account, and answers with its answer's bytes (serialised by the handler: a large
answer off the event loop)."""
_UNREAD = {"ServerLive": pb.ServerLiveRequest(), "ServerReady": pb.ServerReadyRequest()}
_HEALTH_METHODS = {"Check": grpc.stream_unary_rpc_method_handler, "Watch": grpc.stream_stream_rpc_method_handler}
"""The RPCs of grpc.health.v1.Health, and the kind of handler each is served by."""
"""RPCs whose message (without fields) is not read: their request as any client sends it."""


def _serialized(answer: bytes) -> bytes:
    """The response serializer of a ``_RAW`` RPC: its handler's answer is the message's bytes."""
    return answer


class StraightCall(Protocol):
    """What a call served without a task offers its handler (``appliance.grpc.http2.call.Call``)."""

    request: Request

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]: ...

    def peer(self) -> str: ...

    def peek_message(self) -> bytes: ...

    def take_message(self) -> bytes: ...

    def serving(self, stop: Callable[[], object]) -> None: ...

    def ended(self) -> None: ...

    def answer(self, payload: bytes) -> None: ...

    def refuse(self, error: ApplianceError) -> None: ...

    def taken_back(self) -> None: ...


class _Passed:
    """Kept with a call's headers (``Request.memo``) while its connection keeps the header block: the
    caller they name, and the access check it passed for ModelInfer (``Admitted.proof``; the bound on
    requests at once is asked every time), as the HTTP lane keeps them with a head sent again."""

    __slots__ = ("caller", "proof", "known")

    def __init__(self, caller: Caller) -> None:
        self.caller = caller
        self.proof: object = None
        self.known = KnownMessage()
        """The leading bytes and plan of the ModelInfer messages sent under these headers."""


class Straight(grpc.RpcMethodHandler):
    """A unary RPC's admitting handler (``handler``, as its task runs it) that may also serve a call whose
    one message came whole with its headers without a task: ``straight(call)`` takes it (True) or leaves
    it to the task (False)."""

    def __init__(self, handler: grpc.RpcMethodHandler, straight: Callable[[StraightCall], bool]) -> None:
        self.request_streaming = handler.request_streaming
        self.response_streaming = handler.response_streaming
        self.request_deserializer = handler.request_deserializer
        self.response_serializer = handler.response_serializer
        self.unary_unary = handler.unary_unary
        self.unary_stream = handler.unary_stream
        self.stream_unary = handler.stream_unary
        self.stream_stream = handler.stream_stream
        self.straight = straight


@dataclasses.dataclass(slots=True)
class Received:
    """A message as read, not parsed: its bytes are counted on ``account``; ``caller``: who sent it."""

    raw: bytes
    account: Account
    caller: Caller
    known: KnownMessage | None = None
    """Its connection's last ModelInferRequest's leading bytes and plan (a straight call's)."""


async def inflated(message: bytes, account: Account, limits: InflateLimits) -> bytes:
    """``message`` (its bytes on ``account``) as the handler reads it: a ``Compressed`` one inflated on
    ``account`` (and its compressed bytes given back), any other as it is."""
    if not isinstance(message, Compressed):
        return message
    out = await inflate_off_loop(message, message.coding, limits, account, what="message", header="grpc-encoding")
    account.release(len(message))
    return out


async def parse_counted(raw: bytes, method: str, deserializer: Callable[[bytes], Any], account: Account) -> Any:
    """``parse`` under the off-loop rule (protocol.inference.decode_off_loop); then ``raw``'s bytes, which
    ``account`` holds, are released: the message is what is held."""
    message = await decode_off_loop(len(raw), parse, raw, method, deserializer, account)
    account.release(len(raw))
    return message


def parse(raw: bytes, method: str, deserializer: Callable[[bytes], Any], account: Account) -> Any:
    """The request message of ``method`` in ``raw``; its parsed copy counted on ``account``."""
    account.reserve(len(raw))
    return parse_uncounted(raw, method, deserializer)


def parse_uncounted(raw: bytes, method: str, deserializer: Callable[[bytes], Any]) -> Any:
    """``parse`` for a caller that counts the parsed copy itself."""
    try:
        return deserializer(raw)
    except DecodeError as exc:
        if method in _HEALTH_METHODS:
            raise InvalidInput(f"the request is not a valid grpc.health.v1.HealthCheckRequest ({exc}); send "
                               f"the HealthCheckRequest of {HEALTH_SERVICE}.{method}") from None
        name = _METHODS[method].input_type.name if method in _METHODS else "request"
        raise InvalidInput(f"the request is not a valid {name} message ({exc}); send the {name} of Triton's "
                           f"GRPCInferenceService.{method}") from None


def _detached(error: ApplianceError) -> ApplianceError:
    """``error`` without its traceback and context: kept past its ``except`` block, they would hold the
    request's frames (and its message, megabytes) in a reference cycle until the garbage collector ran."""
    error.__traceback__ = None
    error.__context__ = None
    error.__cause__ = None
    return error


def _operation(base: Operation, request: Any) -> Operation:
    """Changing the log or trace settings is control; reading them is like metadata."""
    if base in _UPDATES and request.settings:
        return _UPDATES[base]
    return base


class AdmittingHandlers:
    """The handler of every RPC of ``service`` (Triton's GRPCInferenceService) and of ``health``
    (grpc.health.v1.Health), each admitting its call first; made once."""

    def __init__(self, service: Any, health: HealthService, dataplane: DataPlane, gate: Gate, receivers: Receivers,
                 inflation: InflateLimits) -> None:
        self._dataplane = dataplane
        self._gate = gate
        self._receivers = receivers
        self._inflation = inflation
        self._paths: dict[bytes, grpc.RpcMethodHandler] = {}
        for method, descriptor in _METHODS.items():
            behaviour = getattr(service, method)
            serializer = _serialized if method in _RAW else getattr(pb, descriptor.output_type.name).SerializeToString
            handler: grpc.RpcMethodHandler
            if descriptor.client_streaming:  # ModelStreamInfer: admitted as a stream, its messages read raw
                handler = grpc.stream_stream_rpc_method_handler(
                    functools.partial(self._stream, behaviour), request_deserializer=None,
                    response_serializer=serializer)
            else:
                handler = grpc.stream_unary_rpc_method_handler(
                    functools.partial(self._unary, method, OPERATIONS[method], behaviour,
                                      getattr(pb, descriptor.input_type.name).FromString),
                    request_deserializer=None, response_serializer=serializer)
                if method == "ModelInfer":
                    handler = Straight(handler, functools.partial(self._straight_infer, service))
            self._paths[f"/{_SERVICE_NAME}/{method}".encode()] = handler
        # Check answers once; Watch, its one message read the same way, answers with a stream.
        for method, kind in _HEALTH_METHODS.items():
            run = functools.partial(self._unary, method, Operation.SERVER_READY, getattr(health, method),
                                    HealthCheckRequest.FromString)
            self._paths[f"/{HEALTH_SERVICE}/{method}".encode()] = kind(
                run, request_deserializer=None, response_serializer=HealthCheckResponse.SerializeToString)

    def _straight_infer(self, service: Any, call: StraightCall) -> bool:
        """ModelInfer for a call whose one message came whole with its headers, without a task: admitted
        as ``_serve`` admits it, its bytes counted, then begun on the data plane's straight line
        (``InferenceService.begin_infer``). False (nothing taken) for a message to parse on a worker
        thread: the call's task serves it."""
        if len(call.peek_message()) > DECODE_OFF_LOOP_BYTES:
            return False
        memo = call.request.memo
        if type(memo) is not _Passed:  # a header block this connection has not sent before (or not kept)
            memo = call.request.memo = _Passed(caller_of(call))
        caller = memo.caller
        admitted = None
        account = None
        try:
            self._gate.refuse_if_stopping()
            admitted = self._dataplane.admit(Operation.INFER, caller, memo.proof)
            admitted.__enter__()
            memo.proof = admitted.proof
            account = self._dataplane.account()
            raw = call.take_message()
            account.reserve(len(raw))
            return service.begin_infer(Received(raw, account, caller, memo.known), call, admitted)
        except ApplianceError as exc:
            error: ApplianceError = _detached(exc)
        except Exception as exc:  # noqa: BLE001 - a bug: answered INTERNAL and logged
            error = unexpected("ModelInfer", exc)
        if account is not None:
            account.__exit__(None, None, None)
        if admitted is not None:
            admitted.__exit__(None, None, None)
        call.refuse(error)
        return True

    def by_path(self, path: bytes) -> grpc.RpcMethodHandler | None:
        """The handler of the RPC at ``path`` (an HTTP/2 ``:path``), None for an unknown one."""
        return self._paths.get(path)

    async def _unary(self, method: str, operation: Operation, behaviour: Callable[..., Awaitable[Any]],
                     deserializer: Any, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
        try:
            # ``requests`` stays unread: _serve reads the one message from the call (see Receivers).
            return await self._serve(method, operation, behaviour, deserializer, context)
        except ApplianceError as exc:
            # Aborting raises again: that exception keeps this frame, and a cycle with grpc's frames, until
            # the garbage collector runs; nothing large may be left in it (the request lived in _serve).
            error = _detached(exc)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bug: answered INTERNAL and logged
            await abort_unexpected(context, method, exc)  # its traceback is logged: rare enough to keep
        await abort(context, error)

    async def _serve(self, method: str, operation: Operation, behaviour: Callable[..., Awaitable[Any]],
                     deserializer: Any, context: grpc.aio.ServicerContext) -> Any:
        caller = caller_of(context)
        # Settings RPCs are admitted as reads first; a change is checked again once the message says so.
        with self._gate.admit(operation, caller), self._dataplane.account() as account:
            empty = _UNREAD.get(method)
            if empty is not None:
                return await behaviour(empty, context)
            raw = await self._receivers.receive(cast(Metered, context), context.peer())
            try:
                account.reserve(len(raw))
                raw = await inflated(raw, account, self._inflation)
            except ApplianceError:
                del raw
                raise
            if method in _RAW:
                received = Received(raw, account, caller)
                del raw  # the handler drops the bytes once it has parsed them
                return await behaviour(received, context)
            request = await parse_counted(raw, method, deserializer, account)
            del raw
            changed = _operation(operation, request)
            if changed is not operation:
                self._dataplane.check_access(changed, caller)
            return await behaviour(request, context)

    async def _stream(self, behaviour: Callable[..., Awaitable[None]], requests: AsyncIterator[bytes],
                      context: grpc.aio.ServicerContext) -> None:
        try:
            self._gate.refuse_if_stopping()
            with self._gate.open_stream(caller_of(context)):
                await behaviour(requests, context)
        except ApplianceError as exc:
            await abort(context, exc)
