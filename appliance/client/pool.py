"""BoxPool: send each request to the box best placed to answer it, from any number of threads.

    from appliance.client import BoxPool
    with BoxPool() as pool:                           # follows the boxes on the LAN (mDNS), live
        result = pool.infer("mlp", [tensor])          # tritonclient.http.InferInput(s) in, InferResult out
    BoxPool(["192.168.1.20:8000", "192.168.1.21:8000"])      # or a fixed list (Box objects or host:port)
    BoxPool(protocol="grpc")                                  # tritonclient.grpc inputs and results

See routing.py for the choice of box and transport.py for what is retried on another box.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tritonclient.utils import InferenceServerException

from appliance.client.attempts import PoolBase, as_boxes, infer_options, token_policy
from appliance.client.boxes import Box, Browser
from appliance.client.routing import NoBoxAvailable
from appliance.client.transport import GrpcTransport, HttpTransport, Refused, Unreachable
from appliance.client.trust import TrustStore

__all__ = ["BoxPool"]

log = logging.getLogger(__name__)


class BoxPool(PoolBase):
    """Requests spread over boxes by load, to boxes that have the model READY (see routing.py); a
    request that got no answer, or a 503, is sent to another box; one a box answered with an error is
    not (see transport.py). Thread-safe.

    ``boxes``: a fixed list (Box or "host:port"); None follows the LAN over mDNS (``interfaces``: the
    IPv4 addresses of the interfaces to listen on). ``token``: the bearer token, for boxes that protect
    inference: sent to the boxes of a fixed list, and of the boxes found on the LAN only to those pinned in
    ``trusted_boxes`` (a TrustStore or the path of its file: ``appliance fleet trust`` makes it), at
    their pinned address; never to a box merely found. ``timeout``: seconds one attempt may wait for its
    answer. ``retry_deadline``: seconds a request may spend being retried and waiting for a free box.
    ``refresh``: seconds between two reads of every box's ready models (also read at once when a box's
    mDNS record changes)."""

    def __init__(self, boxes: Sequence[Box | str] | None = None, protocol: str = "http", *, cooldown: float = 30.0,
                 token: str | None = None, timeout: float = 60.0, retry_deadline: float = 30.0,
                 refresh: float = 10.0, interfaces: Sequence[str] = (), busy_backoff: float = 0.25,
                 trusted_boxes: TrustStore | str | Path | None = None) -> None:
        tokens = token_policy(token, trusted_boxes, boxes is not None, "BoxPool")
        super().__init__(protocol, cooldown, retry_deadline, busy_backoff, tokens)
        self._index = HttpTransport(timeout=10.0, tokens=tokens)
        self._transport: HttpTransport | GrpcTransport = (
            GrpcTransport(timeout, tokens) if protocol == "grpc" else HttpTransport(timeout, tokens))
        self._refresh_every = refresh
        self._wanted: queue.Queue[str | None] = queue.Queue()
        self._closed = threading.Event()
        self._browser: Browser | None = None
        if boxes is not None:
            fixed = as_boxes(boxes)
            if not fixed:
                raise NoBoxAvailable("no boxes given; pass BoxPool() to follow the LAN, or discover() first")
            if not any(b.url_for(protocol) for b in fixed):
                raise NoBoxAvailable(f"none of {[b.name for b in fixed]} serves {protocol}; use protocol='http'")
            for box in fixed:
                self._router.add(box)
                self._read_models(box)
        self._refresher = threading.Thread(target=self._refresh_loop, name="boxpool-refresh", daemon=True)
        self._refresher.start()
        if boxes is None:
            self._browser = Browser(interfaces)
            self._browser.listen(self._box_changed)

    def __enter__(self) -> BoxPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the boxes -------------------------------------------------------------------------------
    def _want(self, name: str) -> None:
        self._wanted.put(name)

    def _read_models(self, box: Box) -> None:
        try:
            self._router.set_models(box.name, self._index.ready_models(box))
        except (Unreachable, InferenceServerException, ValueError, KeyError) as exc:
            log.info("cannot read the models of %s: %s", box.name, exc)
            self._router.index_failed(box.name, f"cannot read its repository index ({exc})")

    def _refresh_loop(self) -> None:
        next_full = time.monotonic() + self._refresh_every
        while not self._closed.is_set():
            try:
                name = self._wanted.get(timeout=max(0.0, next_full - time.monotonic()))
            except queue.Empty:
                name = ""
            if name is None:
                return
            boxes = {b.name: b for b in self._router.boxes()}
            if name:
                names = {name}
            else:
                names, next_full = set(boxes), time.monotonic() + self._refresh_every
            for each in names:
                if each in boxes and not self._closed.is_set():
                    self._read_models(boxes[each])

    # -- requests --------------------------------------------------------------------------------
    def infer(self, model: str, inputs: Sequence[Any], outputs: Any = None, *, model_version: str = "",
              request_id: str = "", parameters: dict | None = None, headers: dict | None = None,
              priority: int = 0, timeout: int | None = None, sequence_id: int | str = 0,
              sequence_start: bool = False, sequence_end: bool = False) -> Any:
        """tritonclient's ``infer`` (inputs, outputs and result of the pool's protocol), on the box best
        placed to answer; NoBoxAvailable when none could within ``retry_deadline``."""
        options = infer_options(outputs, model_version, request_id, parameters, headers, priority, timeout,
                                sequence_id, sequence_start, sequence_end)
        attempts = self._attempts(model, options)
        while True:
            box = attempts.next_box()
            try:
                result = self._transport.infer(box, model, inputs, options)
            except (Unreachable, Refused) as exc:
                attempts.retry(box, exc)
                continue
            except BaseException:
                attempts.failed(box)
                raise
            attempts.succeeded(box)
            return result

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        if self._browser is not None:
            self._browser.close()
        self._wanted.put(None)
        self._refresher.join(5)
        self._transport.close()
        self._index.close()
