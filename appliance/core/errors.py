"""One error hierarchy for the whole daemon.

Each error carries the HTTP status it maps to as a class attribute (an ``http.HTTPStatus``, not a
framework constant); the REST layer turns any of them into ``{"error": "..."}`` in one place, the gRPC
layer into a status code (``appliance.grpc.status``) from that same attribute.
"""

from __future__ import annotations

from http import HTTPStatus

__all__ = [
    "internal_message",
    "AlreadyExists",
    "ApplianceError",
    "BackendUnavailable",
    "ConfigError",
    "DeadlineExceeded",
    "Forbidden",
    "InferenceFailed",
    "InputMismatch",
    "InsufficientStorage",
    "InvalidInput",
    "LoadRefused",
    "ModelNotFound",
    "ModelNotReady",
    "NotFound",
    "NotInRepository",
    "NotSupported",
    "PayloadTooLarge",
    "PushRefused",
    "PushTooLarge",
    "RefusedByRuntime",
    "RegionNotFound",
    "RequestTimeout",
    "Unauthorized",
    "Unavailable",
    "UnsupportedEncoding",
    "UnsupportedMediaType",
]


class ApplianceError(Exception):
    """Base of every error the daemon reports to a client."""

    status: HTTPStatus = HTTPStatus.INTERNAL_SERVER_ERROR
    grpc_code: str | None = None
    """The gRPC status (a grpc.StatusCode name) where it is not the one ``status`` maps to (Triton's
    UNKNOWN, ALREADY_EXISTS and CANCELLED are all 400 over HTTP, each its own code over gRPC)."""
    from_model: bool = False
    """Raised by the model's run (its backend or its own error), not by the server before it ran: a
    stream answers those as the request's failed response (Triton's triton_grpc_error ends the stream)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(ApplianceError):
    """The request is malformed or does not match the model (Triton: INVALID_ARG)."""

    status = HTTPStatus.BAD_REQUEST


class InputMismatch(InvalidInput):
    """An input's data does not fit its shape or datatype. Found while decoding, before the model's name
    is at hand: ``triton`` holds Triton's words with ``{model}`` for the name (``finish`` fills it in,
    with the request's id)."""

    def __init__(self, message: str, triton: str, prefixed: bool = True) -> None:
        super().__init__(message)
        self.triton = triton
        self.prefixed = prefixed
        """Triton puts its ``[request id: ...]`` prefix before these words."""
        self.request_id: str | None = None
        """The request's id, where the decoder knew it."""

    def finish(self, model: str) -> InvalidInput:
        prefix = f"[request id: {self.request_id or '<id_unknown>'}] " if self.prefixed else ""
        return InvalidInput(prefix + self.triton.replace("{model}", model))


class PayloadTooLarge(ApplianceError):
    status = HTTPStatus.REQUEST_ENTITY_TOO_LARGE


class RequestTimeout(ApplianceError):
    """The client stopped sending its request; the connection is closed after the answer."""

    status = HTTPStatus.REQUEST_TIMEOUT


class UnsupportedEncoding(ApplianceError):
    """A request body in a content coding the server cannot decode; ``accepted`` lists the ones it can."""

    status = HTTPStatus.UNSUPPORTED_MEDIA_TYPE

    def __init__(self, message: str, accepted: tuple[str, ...]) -> None:
        super().__init__(message)
        self.accepted = accepted


class Unauthorized(ApplianceError):
    """A request that needs the bearer token came without a valid one."""

    status = HTTPStatus.UNAUTHORIZED


class Forbidden(ApplianceError):
    """A request this server refuses whoever sends it (another site's page, a foreign Host name)."""

    status = HTTPStatus.FORBIDDEN


class UnsupportedMediaType(ApplianceError):
    status = HTTPStatus.UNSUPPORTED_MEDIA_TYPE


class RefusedByRuntime(InvalidInput):
    """The runtime refused the request's data while running it (text that is not a number for a graph that
    parses numbers): the request's fault (400), counted as a backend failure as Triton counts it."""


class LoadRefused(InvalidInput):
    """A load request whose config override or files the server cannot use (Triton: "failed to poll from
    model repository"): the request's fault over HTTP (400), INTERNAL over gRPC as Triton answers there
    (its gRPC model-control example checks that code)."""

    grpc_code = "INTERNAL"


class PushRefused(LoadRefused):
    """Pushed files the server cannot use."""


class PushTooLarge(PayloadTooLarge):
    """A push over a size limit: 413 over HTTP, INTERNAL over gRPC (as ``PushRefused``)."""

    grpc_code = "INTERNAL"


class AlreadyExists(InvalidInput):
    """A name that is taken already, e.g. a shared-memory region (Triton: ALREADY_EXISTS, HTTP 400)."""


class NotFound(ApplianceError):
    """Something the request names does not exist (Triton: NOT_FOUND)."""

    status = HTTPStatus.NOT_FOUND


class ModelNotFound(NotFound):
    """Unknown model or version."""


class NotInRepository(ModelNotFound):
    """A load of a model the repository does not have: 404 over HTTP, INTERNAL over gRPC as Triton."""

    grpc_code = "INTERNAL"


class RegionNotFound(NotFound):
    """No shared-memory region is registered under the name a request gives."""


class NotSupported(ApplianceError):
    """A feature this box cannot serve, whoever asks (Triton: UNSUPPORTED, HTTP 501)."""

    status = HTTPStatus.NOT_IMPLEMENTED


class Unavailable(ApplianceError):
    """The server cannot take the request now; ``retry_after`` (seconds) is sent when known."""

    status = HTTPStatus.SERVICE_UNAVAILABLE

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ModelNotReady(Unavailable):
    pass


class DeadlineExceeded(ApplianceError):
    """A request ran past the deadline the daemon gives it (``request_deadline``); it was cancelled."""

    status = HTTPStatus.GATEWAY_TIMEOUT
    grpc_code = "DEADLINE_EXCEEDED"


class InferenceFailed(ApplianceError):
    """The runtime raised while executing a request that passed validation (Triton: INTERNAL)."""

    status = HTTPStatus.INTERNAL_SERVER_ERROR
    from_model = True


class InsufficientStorage(ApplianceError):
    """The box has no room to keep what the request sends (a full disk): 507 over HTTP."""

    status = HTTPStatus.INSUFFICIENT_STORAGE


class ConfigError(ApplianceError):
    """A model's config.pbtxt or files are wrong; reported as the model's load failure."""

    status = HTTPStatus.BAD_REQUEST


class BackendUnavailable(ConfigError):
    """The runtime a model needs is not installed on this box."""


def internal_message(exc: BaseException) -> str:
    """What a client is told of an error no handler expected (HTTP 500, gRPC INTERNAL)."""
    return f"internal error: {type(exc).__name__}: {exc}"
