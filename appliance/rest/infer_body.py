"""A KServe v2 infer request over HTTP as the data plane takes it (``InferSource``): JSON, JSON with
binary tensors, or one raw binary tensor. Both HTTP front ends build one — aiohttp's route, which reads
the body from aiohttp's stream, and the infer lane (``appliance.rest.lane``), which has it in hand."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping

from appliance.core.errors import InvalidInput
from appliance.core.kept import remember
from appliance.engine.model import ModelVersion
from appliance.engine.tensor_checks import DecodeLimits
from appliance.engine.types import InferRequest
from appliance.protocol.inference import Target
from appliance.rest.binary_header import KnownHeader
from appliance.rest.codec import decode_infer_request, decode_raw_request
from appliance.rest.http_basics import HEADER_LENGTH
from appliance.security.budget import Account
from appliance.security.fleet_signature import FleetVerifier

__all__ = ["InferBody", "count_body"]


_LENGTHS: dict[str, int] = {}
"""Header lengths read before, by their text (a binary client's requests repeat a few): at most 256 texts
of at most 16 characters."""
_KEPT_LENGTHS = 256
_KEPT_TEXT = 16


def _header_length(raw: str | None) -> int | None:
    if raw is None:
        return None
    known = _LENGTHS.get(raw)
    if known is not None:
        return known
    digits = raw.strip()
    # ASCII digits only (str.isdigit() alone also takes '²'), without a regular expression.
    if not (0 < len(digits) <= 15 and digits.isascii() and digits.isdigit()):
        raise InvalidInput(f"{HEADER_LENGTH} must be a non-negative integer of at most 15 digits, got {raw[:40]!r}")
    length = int(digits)
    if len(raw) <= _KEPT_TEXT:  # (15 digits and a space or so: padding is read, never kept)
        remember(_LENGTHS, raw, length, _KEPT_LENGTHS)
    return length


def _decode_raw(body: bytes, model: ModelVersion, limits: DecodeLimits,
                reserve: Callable[[int], None]) -> InferRequest:
    """A raw binary request: the body is the model's only input (Triton's binary data extension)."""
    signature = model.signature
    if len(signature.inputs) != 1:  # Triton's words (its "found" is the one raw input), then the fix
        raise InvalidInput(
            f"[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced but got "
            f"{len(signature.inputs)} inputs in '{model.name}' model configuration; send a JSON header with "
            f"{HEADER_LENGTH} instead"
        )
    (spec,) = signature.inputs.values()
    shape = (1, *spec.dims) if signature.batched else tuple(spec.dims)
    return decode_raw_request(body, spec.name, spec.datatype, shape, limits, reserve, one_element=spec.dims == (1,))


def _decoding_work(body: bytes, header_length: int | None) -> int:
    """The bytes decoding works through: all of a JSON body; of a binary one its JSON header, and its
    tensors only when they are BYTES ones (fixed-size tensors are views of the body, whatever their size)."""
    if header_length is None or header_length >= len(body):
        return len(body)
    if header_length == 0 or body.find(b'"BYTES"', 0, header_length) >= 0:  # (no copy of the header)
        return len(body)
    return header_length


def count_body(body: bytes, account: Account, signed: str | None) -> None:
    """A body as read: counted on the request's account, and a signed request's digest checked."""
    account.reserve(len(body))
    if signed is not None:
        FleetVerifier.check_body(signed, hashlib.sha256(body).hexdigest())


def _known() -> Target:
    raise AssertionError("InferBody.ready's target is known: target_now answers it")


class InferBody:
    """One infer request: ``target`` names the model (it may raise: a malformed path is answered after
    admission), ``header_length`` is the Inference-Header-Content-Length header as sent, ``read`` reads
    the whole body, counted on the account it is given. ``InferBody.ready`` makes one whose body is in
    hand (``ReadySource``, for ``Inference.begin``)."""

    endpoint = "HTTP end point"
    frontend = "HTTP"
    streaming_alternative = ("POST .../generate_stream (or gRPC ModelStreamInfer), which returns all its "
                             "responses")

    __slots__ = ("_target", "_named", "_raw_header_length", "_read", "_body", "_header_length", "_headers",
                 "_signed", "_known")

    def __init__(self, target: Callable[[], Target], header_length: str | None,
                 read: Callable[[Account], Awaitable[bytes]] | None, headers: Mapping[str, str] | None = None,
                 named: Target | None = None, body: bytes = b"", signed: str | None = None,
                 known: KnownHeader | None = None) -> None:
        self._headers = headers
        self._target = target
        self._named = named  # the target, where it is known already (``ready``)
        self._raw_header_length = header_length
        self._read = read
        self._body = body
        self._header_length: int | None = None
        self._signed = signed
        self._known = known

    @classmethod
    def ready(cls, target: Target, header_length: str | None, body: bytes, signed: str | None,
              headers: Mapping[str, str], known: KnownHeader | None = None) -> InferBody:
        """A request whose body is in hand, to the model ``target`` names; ``signed``: the digest a signed
        request's body must have; ``known``: the last binary header of its connection (decoded from its
        plan when this one's is the same)."""
        return cls(_known, header_length, None, headers, target, body, signed, known)

    async def target(self, account: Account) -> Target:
        return self.target_now()

    def target_now(self) -> Target:
        named = self._named
        return named if named is not None else self._target()

    def traceparent(self) -> str | None:
        return self._headers.get("traceparent") if self._headers is not None else None

    async def receive(self, account: Account) -> int:
        self._header_length = _header_length(self._raw_header_length)
        if self._read is None:  # in hand (``ready``)
            self.receive_now(account)
        else:
            self._body = await self._read(account)
        return _decoding_work(self._body, self._header_length)

    def decoding_work(self) -> int:
        if self._raw_header_length is None:  # a JSON body (the common one): all of it
            self._header_length = None
            return len(self._body)
        self._header_length = _header_length(self._raw_header_length)
        return _decoding_work(self._body, self._header_length)

    def receive_now(self, account: Account) -> None:
        count_body(self._body, account, self._signed)

    def decode(self, model: ModelVersion, limits: DecodeLimits, reserve: Callable[[int], None]) -> InferRequest:
        header_length = self._header_length
        if header_length == 0:
            return _decode_raw(self._body, model, limits, reserve)
        if header_length is not None and self._known is not None:
            return self._known.decode(self._body, header_length, limits, reserve)
        return decode_infer_request(self._body, header_length, limits, reserve)
