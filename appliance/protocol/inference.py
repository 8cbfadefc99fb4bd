"""Inference through the data plane: the one opening every transport's inference shares.

Look the model up (404/503 before the request's bytes are read) and hold it until the answer, open the
request's account of the memory budget, refuse a decoupled model where only one response can go back,
read and decode the request (on a worker thread when decoding is real work), apply the browser rules
to a request that names a shared-memory region, move tensors in and out of shared memory, trace it.

A transport hands its request in as an ``InferSource``: its wire form, read and decoded on demand.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

import numpy as np

from appliance.core.errors import InputMismatch, InvalidInput, ModelNotFound, ModelNotReady, NotSupported
from appliance.engine.model import ModelVersion
from appliance.engine.scheduler.completion import outcome
from appliance.engine.streaming import OneResponse, Responses, StreamLimits
from appliance.engine.tensor_checks import BYTES_ELEMENT_OVERHEAD, DecodeLimits
from appliance.engine.types import InferRequest, InferResponse
from appliance.protocol.admission import Caller
from appliance.protocol.results import InferResult
from appliance.protocol.shared_memory import SharedMemoryRegistry
from appliance.protocol.shared_memory.binding import Binding
from appliance.protocol.tracing import Trace, Tracer
from appliance.repository.registry import ModelRegistry
from appliance.security.budget import Account, MemoryBudget

__all__ = ["DECODE_OFF_LOOP_BYTES", "Flight", "Inference", "InferSource", "NOT_SERVED", "OneInference", "ReadySource",
           "Target",
           "decode_off_loop", "join_releasing_gil", "tensor_work"]

_COPY_CHUNK = 1 << 20


def join_releasing_gil(pieces: list[bytes | memoryview], size: int | None = None) -> bytes:
    """``b"".join(pieces)``, with the GIL let go for the large copy. CPython's join releases it only when
    every piece is a bytes object (with a memoryview among them it holds it throughout: 0.08 s for
    128 MiB, a stall of every port though on a worker thread), so each view is copied out first, 1 MiB at
    a time (the GIL held for one such copy at once). Both transports' encoders answer through it; an
    answer under one chunk is joined as it is (one copy, not two: the common small answer). ``size``: the
    pieces' bytes together, where the caller knows them."""
    if size is None:
        size = 0
        for piece in pieces:  # (a loop: a generator costs a frame)
            size += piece.nbytes if type(piece) is memoryview else len(piece)
    if size <= _COPY_CHUNK:
        return b"".join(pieces)
    out: list[bytes] = []
    for piece in pieces:
        if isinstance(piece, memoryview):
            out += [bytes(piece[start:start + _COPY_CHUNK]) for start in range(0, len(piece), _COPY_CHUNK)]
        else:
            out.append(piece)
    return b"".join(out)


DECODE_OFF_LOOP_BYTES = 1 << 20
"""Decoding work above this many bytes (JSON text, BYTES tensors, a protobuf message) runs on a worker
thread, so that it never stalls the event loop; below it the trip to a thread costs more."""

T = TypeVar("T")


async def decode_off_loop(size: int, work: Callable[..., T], *args: Any) -> T:
    """``work(*args)``, decoding (or encoding) ``size`` bytes: on a worker thread above DECODE_OFF_LOOP_BYTES,
    inline below (the one place the rule is applied: REST bodies, gRPC messages and stream requests, and
    the answers to them, sized by ``tensor_work``)."""
    if size > DECODE_OFF_LOOP_BYTES:
        return await asyncio.to_thread(work, *args)
    return work(*args)


def tensor_work(array: np.ndarray) -> int:
    """The bytes encoding ``array`` as raw data works through: its size; for a BYTES tensor (a Python step
    per element) its elements' with BYTES_ELEMENT_OVERHEAD each, counted one by one only while that is cheap
    (while the overhead alone stays under DECODE_OFF_LOOP_BYTES)."""
    if array.dtype != object:
        return array.nbytes
    work = array.size * BYTES_ELEMENT_OVERHEAD
    if work > DECODE_OFF_LOOP_BYTES:
        return work
    return work + sum(len(item) for item in array.flat if isinstance(item, (bytes, str)))


NOT_SERVED = "shared memory is not served by this server; send the tensors in the request"

@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """The model a request names: ``version`` None for the model's policy (the latest ready one)."""

    model: str
    version: str | None = None
    timeout: float | None = None
    """Seconds the request may wait for its model to load on demand, where it says so before its body is
    read (gRPC: Triton's ``timeout`` parameter, in the message already parsed); None: load_on_demand_timeout
    alone bounds the wait (docs/memory.md)."""


class InferSource(Protocol):
    """One inference request as its transport holds it."""

    endpoint: str
    """What the client called, as refusals name it ("HTTP end point", "ModelInfer RPC")."""
    frontend: str
    """The transport, as trace marks name it: "HTTP" or "GRPC"."""
    streaming_alternative: str
    """Where a decoupled model's responses can be had instead, for the refusal."""

    async def target(self, account: Account) -> Target:
        """The model the request names. A transport that carries the name inside the message (gRPC)
        reads the message here, counted on ``account``."""

    async def receive(self, account: Account) -> int:
        """Read the rest of the request into memory, counted on ``account``; answer how many bytes of it
        decoding works through (it then runs on a worker thread above DECODE_OFF_LOOP_BYTES)."""

    def decode(self, model: ModelVersion, limits: DecodeLimits, reserve: Callable[[int], None]) -> InferRequest:
        """The core request; ``reserve`` counts what decoding allocates before it is allocated."""

    def traceparent(self) -> str | None:
        """The W3C ``traceparent`` the request carries (an HTTP header, gRPC metadata), if any; asked for
        only when a trace would use it."""


class ReadySource(InferSource, Protocol):
    """An ``InferSource`` whose request is all in hand: what ``Inference.begin`` takes, without a wait."""

    def target_now(self) -> Target:
        """The model the request names."""

    def decoding_work(self) -> int:
        """The bytes decoding would work through (``receive``'s answer), before anything is counted."""

    def receive_now(self, account: Account) -> None:
        """``receive``, with no wait: the request's bytes counted on ``account`` (and checked)."""


def decoupled_refusal(source: InferSource, model: str) -> InvalidInput:
    return InvalidInput(f"{source.endpoint} doesn't support models with decoupled transaction policy; call model "
                        f"'{model}' through {source.streaming_alternative}")


class Inference:
    def __init__(self, registry: ModelRegistry, budget: MemoryBudget, limits: DecodeLimits, *,
                 shared_memory: SharedMemoryRegistry | None, tracer: Tracer | None,
                 stream_limits: StreamLimits) -> None:
        self._registry = registry
        self._budget = budget
        self._limits = limits
        self._shared_memory = shared_memory
        self._tracer = tracer
        self._stream_limits = stream_limits

    def account(self) -> Account:
        """A new account of the memory budget, for a transport that must count bytes it reads before the
        request reaches ``infer`` (a stream's requests, reserved when read)."""
        return self._budget.account()

    def begin(self, caller: Caller, source: ReadySource, received_ns: int,
              then: Callable[[Flight, InferResult | None, BaseException | None], None]) -> Flight | None:
        """``infer`` as a straight line, for a request whose bytes are all in hand (``source``): look up,
        hold, count, decode and queue it in this step, and call ``then(flight, result, error)`` in the step
        that has its result; the caller encodes the result, then ends the flight (``Flight.end``). None
        where the line does not apply (the model is not ready here and now, or is one ``begin`` does not
        serve, or decoding is worker-thread work): ``infer`` then serves the request, nothing having been
        taken. Refusals found in this step raise here; a request that needs to wait on something but its
        model (shared memory) runs the rest as a task. A trace sampled here is written at ``end``."""
        target = source.target_now()
        try:
            model = self._registry.get(target.model, target.version)
        except (ModelNotFound, ModelNotReady):
            return None
        if not model.straight or source.decoding_work() > DECODE_OFF_LOOP_BYTES:
            return None
        flight = Flight(self, model.hold(), self._budget, then)
        try:
            source.receive_now(flight)
            request = self._decoded(model, source, caller, flight)
            trace = request.trace = flight.trace = self._start_trace(model, source, received_ns)
            if trace is None and not request.uses_shared_memory:
                flight.withdraw = model.begin(request, functools.partial(flight.landed, request))
            else:
                task = asyncio.get_running_loop().create_task(self._run(model, request, caller, flight.reserve))
                task.add_done_callback(functools.partial(flight.ran, request))
                flight.withdraw = task.cancel
        except BaseException:
            flight.end()
            raise
        return flight

    def takes(self, target: Target) -> bool:
        """Whether ``begin`` would take a request to ``target`` now (its model is ready here and one the line
        serves): a transport asks before it waits for a body that came after its head, which the awaited
        path reads only once the model is found."""
        try:
            return self._registry.get(target.model, target.version).straight
        except (ModelNotFound, ModelNotReady):
            return False

    async def straight(self, caller: Caller, source: ReadySource, received_ns: int,
                       encode: Callable[[InferResult], Awaitable[T]]) -> T | None:
        """``begin`` for a transport whose request has a task anyway (a body that came after its head, a gRPC
        call): the result, encoded by ``encode`` while the request still holds what it holds; None where
        the line does not take the request (``infer`` serves it). A refusal or the model's error raises
        here, with everything let go; cancelling the caller's task takes the request back."""
        landed: asyncio.Future[tuple[InferResult | None, BaseException | None]] = \
            asyncio.get_running_loop().create_future()

        def then(flight: Flight, result: InferResult | None, error: BaseException | None) -> None:
            if not landed.done():  # (not when the caller was cancelled meanwhile)
                landed.set_result((result, error))

        flight = self.begin(caller, source, received_ns, then)
        if flight is None:
            return None
        sent = None
        try:
            try:
                result, error = await landed
            except asyncio.CancelledError:
                flight.cancel()
                raise
            if error is not None:
                raise error
            assert result is not None
            answer = await encode(result)
            sent = flight.sent(source.frontend)
            return answer
        finally:
            flight.end(sent)

    def infer(self, caller: Caller, source: InferSource, *, received_ns: int | None = None,
              account: Account | None = None) -> OneInference:
        """One request, one response: ``async with inference.infer(...) as result``; the model stays held
        and the request's bytes counted while the caller encodes the result inside the block.
        ``account``: one the transport opened to count bytes it read before (closed here)."""
        return OneInference(self, caller, source, received_ns, account)

    @contextlib.asynccontextmanager
    async def infer_stream(self, caller: Caller, source: InferSource, *, received_ns: int | None = None,
                           account: Account | None = None) -> AsyncIterator[Responses]:
        """Every response of one request, to read with ``async for`` inside the ``async with``: a
        decoupled model's as it sends them (the last one final), any other model's one response as a
        stream of one. Errors found before the request runs raise here; later ones arrive as items with
        ``error`` set (responses not yet read count on the request's account). Leaving early cancels the
        request (the model sees ``is_cancelled()``)."""
        with account or self._budget.account() as opened:
            model, request = await self._open(source, caller, opened, received_ns)
            try:
                responses = await self.respond(model, request, caller, opened.reserve, opened.release)
                try:
                    yield responses
                finally:
                    responses.close()
            finally:
                model.let_go()

    async def _open(self, source: InferSource, caller: Caller, account: Account, received_ns: int | None, *,
                    refuse_decoupled: bool = False,
                    ) -> tuple[ModelVersion, InferRequest]:
        """The opening every inference shares: the version the source names, looked up and held (the
        caller lets go of it when done, ``ModelVersion.let_go``; a failure here lets it go), the request
        received and decoded into ``account``, and its trace started when sampled."""
        target = await source.target(account)
        try:
            version = self._registry.get(target.model, target.version)
        except (ModelNotFound, ModelNotReady):
            version = await self._load_on_demand(target)
        model = version.hold()
        try:
            if refuse_decoupled and model.decoupled:
                raise decoupled_refusal(source, model.name)
            request = await self._decode(model, source, caller, account)
            request.trace = self._start_trace(model, source, received_ns)
        except BaseException:
            model.let_go()
            raise
        return model, request

    async def _load_on_demand(self, target: Target) -> ModelVersion:
        """The version ``target`` names once a load on demand has made it ready (load_on_demand); the
        lookup's refusal as it was where the model is not one to load. A budget load beside this one may
        unload the model again before this request holds it: then it loads again, a few times at most."""
        residency = self._registry.residency
        for _ in range(3):
            if not residency.on_demand(target.model):
                break
            await residency.demand(target.model, target.timeout)
            try:
                return self._registry.get(target.model, target.version)
            except (ModelNotFound, ModelNotReady):
                continue
        return self._registry.get(target.model, target.version)

    async def respond(self, model: ModelVersion, request: InferRequest, caller: Caller,
                      reserve: Callable[[int], None], release: Callable[[int], None]) -> Responses:
        """Run a decoded ``request`` on ``model`` (held by the caller until the result is closed): its
        responses as ``infer_stream`` hands them out. ``reserve`` and ``release``: the request's account.
        A trace the request carries is written when its last response is ready."""
        if model.decoupled:
            return await self._open_stream(model, request, caller, reserve, release)
        try:
            return OneResponse(await self._run(model, request, caller, reserve))
        finally:
            if request.trace is not None:
                assert self._tracer is not None
                self._tracer.finish(request.trace)

    def _start_trace(self, model: ModelVersion, source: InferSource, received_ns: int | None) -> Trace | None:
        """The request's trace when it is sampled: its front end's receive marks, then REQUEST_START."""
        if self._tracer is None or not self._tracer.settings.tracing:  # no scope traces: nothing to count
            return None
        return self._tracer.start(model.name, model.version, received_ns, frontend=source.frontend,
                                  read_ns=time.monotonic_ns(), traceparent=source.traceparent)

    async def _decode(self, model: ModelVersion, source: InferSource, caller: Caller,
                      account: Account) -> InferRequest:
        work = await source.receive(account)
        return await decode_off_loop(work, self._decoded, model, source, caller, account)

    def _decoded(self, model: ModelVersion, source: InferSource, caller: Caller, account: Account) -> InferRequest:
        """The request ``source`` has received, decoded (Triton's words for a mismatch) and checked for what
        it may ask of shared memory."""
        try:
            request = source.decode(model, self._limits, account.reserve)
        except InputMismatch as mismatch:  # in Triton's words, now that the model is known
            raise mismatch.finish(model.name) from None
        if request.uses_shared_memory:
            if self._shared_memory is None:
                raise NotSupported(NOT_SERVED)
            if caller.browser_refusal is not None:  # a page must not read or write another client's regions
                raise caller.browser_refusal
        return request

    def _local(self, caller: Caller) -> bool:
        assert self._shared_memory is not None
        return self._shared_memory.local_peers.is_local(caller.address, caller.connected_to, direct=caller.direct)

    async def _run(self, model: ModelVersion, request: InferRequest, caller: Caller,
                   reserve: Callable[[int], None]) -> InferResponse:
        if request.trace is None and not request.uses_shared_memory:  # most requests: nothing around it
            return await model.infer(request)
        try:
            return await self._run_bound(model, request, caller, reserve)
        finally:
            if request.trace is not None:
                Tracer.end(request.trace)

    async def _run_bound(self, model: ModelVersion, request: InferRequest, caller: Caller,
                         reserve: Callable[[int], None]) -> InferResponse:
        """Run ``request``, its tensors read from and written into the shared-memory regions it names."""
        if not request.uses_shared_memory:
            return await model.infer(request)
        binding = await self._bind(model, request, caller, reserve)
        with binding:
            response = await model.infer(request)
            await binding.write(response)
        return response

    async def _bind(self, model: ModelVersion, request: InferRequest, caller: Caller,
                    reserve: Callable[[int], None]) -> Binding:
        """The shared-memory regions ``request`` names, bound for it; a mismatch in Triton's words."""
        assert self._shared_memory is not None
        try:
            return await self._shared_memory.bind(request, local=self._local(caller), reserve=reserve)
        except InputMismatch as mismatch:
            mismatch.request_id = request.id
            raise mismatch.finish(model.name) from None

    async def _open_stream(self, model: ModelVersion, request: InferRequest, caller: Caller,
                           reserve: Callable[[int], None], release: Callable[[int], None]) -> Responses:
        tracer = self._tracer
        binding = None
        try:
            if request.uses_shared_memory:
                binding = await self._bind(model, request, caller, reserve)
            stream = await model.open_stream(request, self._stream_limits, (reserve, release))
        except BaseException:
            if binding is not None:
                binding.close()
            if request.trace is not None:
                assert tracer is not None
                tracer.finish(request.trace)
            raise
        if request.trace is not None:
            trace = request.trace
            assert tracer is not None
            # Written once the stream has ended and the request has run (its COMPUTE_* marks are set when
            # run_requests returns, which may come after the final response).
            stream.on_close(lambda _: stream.ran.add_done_callback(lambda _: tracer.finish(trace)))
        if binding is not None:
            stream.set_writer(binding.write)  # each response's outputs go into the regions it named
            stream.on_close(lambda _: binding.close())
        return stream


class OneInference:
    """``Inference.infer``'s asynchronous context manager: entering looks the model up and holds it,
    opens the account, decodes and runs the request and gives its ``InferResult``; leaving writes the
    trace (with the front end's marks around the answer, when it had a receive mark), lets the model go
    and closes the account. A class rather than an async generator: every request enters one."""

    __slots__ = ("_inference", "_caller", "_source", "_received_ns", "_account", "_held", "_trace", "_sending")

    def __init__(self, inference: Inference, caller: Caller, source: InferSource, received_ns: int | None,
                 account: Account | None) -> None:
        self._inference = inference
        self._caller = caller
        self._source = source
        self._received_ns = received_ns
        self._account = account
        self._held: ModelVersion | None = None
        self._trace: Trace | None = None
        self._sending = 0

    async def __aenter__(self) -> InferResult:
        inference, source = self._inference, self._source
        opened = self._account = self._account or inference._budget.account()
        try:
            model, request = await inference._open(source, self._caller, opened, self._received_ns,
                                                   refuse_decoupled=True)
            self._held = model
            self._trace = request.trace
            response = await inference._run(model, request, self._caller, opened.reserve)
        except BaseException:
            self._end(None)
            raise
        if self._trace is not None:
            self._sending = time.monotonic_ns()
        return InferResult(request, response)

    async def __aexit__(self, kind: type[BaseException] | None, *exc_info: object) -> None:
        sent = None
        if kind is None and self._trace is not None and self._received_ns is not None:
            sent = (self._source.frontend, self._sending, time.monotonic_ns())  # the answer's marks too
        self._end(sent)

    def _end(self, sent: tuple[str, int, int] | None) -> None:
        assert self._account is not None
        release(self._inference, self._trace, self._held, self._account, sent)


class Flight(Account):
    """One request on ``Inference.begin``'s straight line: what it holds (its model version, its bytes, as
    its own account of the memory budget, and its trace), how to withdraw it, and ``then``, told its
    result. ``end`` lets everything go, once: after the answer is encoded, or at once on an error."""

    __slots__ = ("_inference", "version", "trace", "withdraw", "_then", "_sending", "_ended")

    def __init__(self, inference: Inference, version: ModelVersion, budget: MemoryBudget,
                 then: Callable[[Flight, InferResult | None, BaseException | None], None]) -> None:
        self._budget = budget  # (Account's two fields, without its __init__'s call: every request makes one)
        self._held = 0
        self._inference = inference
        self.version = version
        self.trace: Trace | None = None
        self.withdraw: Callable[[], object] | None = None
        """Takes the request back (its client went away): ``then`` gets CancelledError, unless it had its
        result already."""
        self._then = then
        self._sending = 0
        self._ended = False

    def landed(self, request: InferRequest, response: InferResponse | None, error: BaseException | None) -> None:
        """The model's answer (``ModelVersion.begin``'s ``then``)."""
        self.withdraw = None
        if self.trace is not None and error is None:
            self._sending = time.monotonic_ns()
        self._then(self, InferResult(request, response) if response is not None else None, error)

    def ran(self, request: InferRequest, task: asyncio.Task) -> None:
        """The answer of a request whose run was a task."""
        self.landed(request, *outcome(task))

    def cancel(self) -> None:
        """Take the request back, wherever it is (its client went away): see ``withdraw``."""
        withdraw, self.withdraw = self.withdraw, None
        if withdraw is not None:
            withdraw()

    def end(self, sent: tuple[str, int, int] | None = None) -> None:
        """Let the model version, the account and the trace go (``sent``: the front end's name and the
        marks around writing the answer, for the trace)."""
        if self._ended:
            return
        self._ended = True
        release(self._inference, self.trace, self.version, self, sent)

    def sent(self, frontend: str) -> tuple[str, int, int] | None:
        """The marks around the answer for ``end``, where the request is traced."""
        return (frontend, self._sending, time.monotonic_ns()) if self.trace is not None else None


def release(inference: Inference, trace: Trace | None, held: ModelVersion | None,
            account: Account, sent: tuple[str, int, int] | None) -> None:
    """What a request held, let go: its trace written, its model version and its account released."""
    try:
        if trace is not None:
            assert inference._tracer is not None
            inference._tracer.finish(trace, sent)
    finally:
        try:
            if held is not None:
                held.let_go()
        finally:
            account.close()
