"""The messages of a daemon–worker link (``appliance.workers.link``), as tuples of plain values:

- worker → daemon: ``(REQUEST, id, head fields, body, peer, local)``, one lane request, with its body
  when it came with the head, else None and ``(BODY, id, body)`` once the body is in (the daemon admits
  the request, or refuses it, meanwhile); ``(CANCEL, id)``, its client went away.
  ``(READY,)``: it accepts.
- daemon → worker: ``(ANSWER, id, answer buffers, close)``; ``(STOP, seconds)``, stop accepting and
  finish within ``seconds``.

A head travels as its fields (``head_fields``) and is rebuilt in the daemon (``lane_head``), checked as
it is rebuilt: the operation must be one the lane serves, the fields strings."""

from __future__ import annotations

from multidict import CIMultiDict

from appliance.protocol.operations import Operation
from appliance.rest.lane_wire import LaneHead

__all__ = ["ANSWER", "BODY", "CANCEL", "READY", "REQUEST", "STOP", "head_fields", "lane_head"]

REQUEST, CANCEL, ANSWER, STOP, BODY, READY = 1, 2, 3, 4, 5, 6

_LANE_OPERATIONS = frozenset((Operation.INFER, Operation.SERVER_LIVE, Operation.SERVER_READY, Operation.MODEL_READY,
                              Operation.MODEL_METADATA, Operation.MODEL_CONFIG))


def head_fields(head: LaneHead) -> tuple:
    headers = [(str(name), value) for name, value in head.headers.items()]  # plain str, not multidict's istr
    return (head.operation.value, head.method, head.target, head.model, head.version, headers, head.length, head.close)


def lane_head(fields: tuple) -> LaneHead:
    """The head ``fields`` describe; ValueError when they do not describe a lane request's."""
    operation, method, target, model, version, headers, length, close = fields
    kind = Operation(operation)
    if kind not in _LANE_OPERATIONS:
        raise ValueError(f"{kind} is no lane request")
    if not all(isinstance(v, str) for v in (method, target, model)) or not isinstance(length, int) or \
            (version is not None and not isinstance(version, str)) or not isinstance(headers, list) or \
            not all(isinstance(f, tuple) and len(f) == 2 and all(isinstance(x, str) for x in f) for f in headers):
        raise ValueError("malformed lane head")
    return LaneHead(kind, method, target, model, version, CIMultiDict(headers), length, bool(close))
