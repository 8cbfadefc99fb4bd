"""TritonError (with Triton's codes) and TritonModelException."""

from __future__ import annotations

__all__ = ["TritonError", "TritonModelException"]


class TritonError(Exception):
    """An error a model returns in a response (``InferenceResponse(error=...)``) or raises."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        super().__init__(message)
        self._message = message
        self._code = int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class TritonModelException(Exception):
    """Raised by the Python backend's own calls (Triton raises it, e.g., from Tensor.from_dlpack)."""
