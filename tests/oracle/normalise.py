"""What must differ between two servers, made equal before answers are compared: nothing else.

* the server's ``version`` (Triton's release vs this server's);
* durations and time stamps in statistics (``ns``, ``last_inference``): only zero / not zero is kept,
  so "this server reports no time for queueing" still shows;
* the order of a gRPC stream's responses *across* requests (two models finish in either order); each
  request's own responses keep their order.
"""

from __future__ import annotations

import copy
from typing import Any

from tests.oracle.wire import Answer

__all__ = ["NONZERO", "normalise"]

NONZERO = "<nonzero>"


def normalise(case_name: str, answer: Answer) -> Answer:
    body = copy.deepcopy(answer.body)
    if case_name.endswith("server.metadata") and isinstance(body, dict) and "version" in body:
        body["version"] = "<version>"
    if ".stats." in case_name or case_name.endswith(".stats"):
        body = _timings(body)
    if isinstance(body, dict) and isinstance(body.get("responses"), list):
        body["responses"] = sorted(body["responses"], key=_request_id)
    return Answer(answer.status, body, dict(answer.extra))


def _timings(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: (_zero_or_not(item) if key in ("ns", "last_inference") else _timings(item))
                for key, item in value.items()}
    if isinstance(value, list):
        return [_timings(item) for item in value]
    return value


def _zero_or_not(value: Any) -> Any:
    try:
        return NONZERO if int(value) != 0 else 0
    except (TypeError, ValueError):
        return value


def _request_id(response: Any) -> str:
    if isinstance(response, dict):
        return str(response.get("infer_response", {}).get("id", ""))
    return ""
