"""The one place errors become gRPC statuses: the HTTP status an ``ApplianceError`` carries picks the code,
as Triton maps its own error codes (INVALID_ARG -> INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE, INTERNAL,
UNSUPPORTED -> UNIMPLEMENTED, ALREADY_EXISTS)."""

from __future__ import annotations

import logging
import math
from http import HTTPStatus
from typing import NamedTuple

import grpc

from appliance.core.errors import AlreadyExists, ApplianceError, InferenceFailed, Unavailable, internal_message

__all__ = ["Status", "abort", "abort_unexpected", "status_code", "status_of", "unexpected"]

log = logging.getLogger(__name__)

_CODES = {
    HTTPStatus.BAD_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    HTTPStatus.UNAUTHORIZED: grpc.StatusCode.UNAUTHENTICATED,
    HTTPStatus.FORBIDDEN: grpc.StatusCode.PERMISSION_DENIED,
    HTTPStatus.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    HTTPStatus.REQUEST_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    HTTPStatus.CONFLICT: grpc.StatusCode.ALREADY_EXISTS,
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    HTTPStatus.UNSUPPORTED_MEDIA_TYPE: grpc.StatusCode.INVALID_ARGUMENT,
    HTTPStatus.INTERNAL_SERVER_ERROR: grpc.StatusCode.INTERNAL,
    HTTPStatus.NOT_IMPLEMENTED: grpc.StatusCode.UNIMPLEMENTED,
    HTTPStatus.SERVICE_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    HTTPStatus.INSUFFICIENT_STORAGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def status_code(error: ApplianceError) -> grpc.StatusCode:
    if isinstance(error, AlreadyExists):  # a 400 over HTTP, as Triton's; gRPC has a code of its own
        return grpc.StatusCode.ALREADY_EXISTS
    if error.grpc_code is not None:
        return grpc.StatusCode[error.grpc_code]
    code = _CODES.get(HTTPStatus(error.status))
    if code is not None:
        return code
    return grpc.StatusCode.INVALID_ARGUMENT if 400 <= error.status < 500 else grpc.StatusCode.INTERNAL


class Status(NamedTuple):
    """How a call ends for an error: the status, its message and the trailing metadata (retry-after)."""

    code: grpc.StatusCode
    message: str
    trailing: tuple[tuple[str, str], ...]


def status_of(error: ApplianceError) -> Status:
    trailing: tuple[tuple[str, str], ...] = ()
    if isinstance(error, Unavailable) and error.retry_after is not None:
        trailing = (("retry-after", str(max(1, math.ceil(error.retry_after)))),)
    return Status(status_code(error), error.message, trailing)


async def abort(context: grpc.aio.ServicerContext, error: ApplianceError) -> None:
    """End the call with the error's status and message (raises, as ``context.abort`` does)."""
    status = status_of(error)
    if status.trailing:
        context.set_trailing_metadata(status.trailing)
    await context.abort(status.code, status.message)


def unexpected(method: str, error: BaseException) -> InferenceFailed:
    """An error no handler expected (a bug), logged with its traceback, as the call ends for it (INTERNAL)."""
    log.error("unhandled error serving gRPC %s", method, exc_info=error)
    return InferenceFailed(internal_message(error))


async def abort_unexpected(context: grpc.aio.ServicerContext, method: str, error: Exception) -> None:
    await abort(context, unexpected(method, error))
