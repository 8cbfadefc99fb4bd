"""AsyncBoxPool: BoxPool's twin for asyncio, safe from any number of tasks of one event loop.

    async with AsyncBoxPool() as pool:               # follows the LAN; or AsyncBoxPool(["host:8000", ...])
        result = await pool.infer("mlp", [tensor])   # tritonclient.http.InferInput(s) in, InferResult out

Same routing (routing.py) and retry rules (transport.py) as BoxPool; HTTP over one aiohttp session,
gRPC over one tritonclient.grpc.aio client per box.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
from tritonclient.utils import InferenceServerException

from appliance.client.attempts import PoolBase, as_boxes, infer_options, token_policy
from appliance.client.boxes import Box, Browser
from appliance.client.routing import NoBoxAvailable
from appliance.client.transport import (
    Refused,
    Unreachable,
    classify_grpc,
    classify_http,
    error_message,
    grpc_options,
    headers_for,
    infer_path,
    ready_models,
    sequence_options,
)
from appliance.client.trust import TrustStore

__all__ = ["AsyncBoxPool"]

log = logging.getLogger(__name__)


class AsyncBoxPool(PoolBase):
    """See BoxPool; create it inside the event loop that uses it (``async with AsyncBoxPool(...)``)."""

    def __init__(self, boxes: Sequence[Box | str] | None = None, protocol: str = "http", *, cooldown: float = 30.0,
                 token: str | None = None, timeout: float = 60.0, retry_deadline: float = 30.0,
                 refresh: float = 10.0, interfaces: Sequence[str] = (), busy_backoff: float = 0.25,
                 trusted_boxes: TrustStore | str | Path | None = None) -> None:
        super().__init__(protocol, cooldown, retry_deadline, busy_backoff,
                         token_policy(token, trusted_boxes, boxes is not None, "AsyncBoxPool"))
        self._timeout = timeout
        self._fixed = as_boxes(boxes) if boxes is not None else None
        if self._fixed is not None and not self._fixed:
            raise NoBoxAvailable("no boxes given; pass AsyncBoxPool() to follow the LAN")
        self._interfaces = tuple(interfaces)
        self._refresh_every = refresh
        self._session: aiohttp.ClientSession | None = None
        self._grpc: dict[str, Any] = {}
        self._wanted: asyncio.Queue[str] | None = None
        self._tasks: list[asyncio.Task] = []
        self._browser: Browser | None = None

    async def __aenter__(self) -> AsyncBoxPool:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=self._timeout),
            connector=aiohttp.TCPConnector(limit=0))
        self._wanted = asyncio.Queue()
        if self._fixed is not None:
            for box in self._fixed:
                self._router.add(box)
            await asyncio.gather(*(self._read_models(box) for box in self._fixed))
        self._tasks.append(asyncio.create_task(self._refresh_loop(), name="boxpool-refresh"))
        if self._fixed is None:
            self._browser = await asyncio.to_thread(Browser, self._interfaces)

            def changed(box: Box, present: bool) -> None:  # on the browser's thread
                loop.call_soon_threadsafe(self._box_changed, box, present)

            self._browser.listen(changed)

    # -- the boxes -------------------------------------------------------------------------------
    def _want(self, name: str) -> None:
        if self._wanted is not None:
            self._wanted.put_nowait(name)

    async def _read_models(self, box: Box) -> None:
        assert self._session is not None
        try:
            async with self._session.post(box.base_url + "/v2/repository/index", data=b'{"ready": true}',
                                          headers=headers_for(self._tokens.token_for(box),
                                                              {"Content-Type": "application/json"}),
                                          timeout=aiohttp.ClientTimeout(total=10)) as response:
                body = await response.read()
                if response.status != 200:
                    raise ValueError(error_message(response.status, body))
                self._router.set_models(box.name, ready_models(json.loads(body)))
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError, KeyError) as exc:
            log.info("cannot read the models of %s: %s", box.name, exc)
            self._router.index_failed(box.name, f"cannot read its repository index ({exc})")

    async def _refresh_loop(self) -> None:
        assert self._wanted is not None
        while True:
            try:
                name = await asyncio.wait_for(self._wanted.get(), self._refresh_every)
                names = {name}
            except TimeoutError:
                names = {b.name for b in self._router.boxes()}
            boxes = {b.name: b for b in self._router.boxes()}
            await asyncio.gather(*(self._read_models(boxes[n]) for n in names if n in boxes))

    # -- requests --------------------------------------------------------------------------------
    async def infer(self, model: str, inputs: Sequence[Any], outputs: Any = None, *, model_version: str = "",
                    request_id: str = "", parameters: dict | None = None, headers: dict | None = None,
                    priority: int = 0, timeout: int | None = None, sequence_id: int | str = 0,
                    sequence_start: bool = False, sequence_end: bool = False) -> Any:
        if self._session is None:
            raise RuntimeError("start the pool first: async with AsyncBoxPool(...) as pool")
        options = infer_options(outputs, model_version, request_id, parameters, headers, priority, timeout,
                                sequence_id, sequence_start, sequence_end)
        attempts = self._attempts(model, options)
        while True:
            box = await attempts.next_box_async()
            try:
                if self.protocol == "grpc":
                    result = await self._infer_grpc(box, model, inputs, options)
                else:
                    result = await self._infer_http(box, model, inputs, options)
            except (Unreachable, Refused) as exc:
                attempts.retry(box, exc)
                continue
            except BaseException:  # an error the box answered, or the caller's cancellation
                attempts.failed(box)
                raise
            attempts.succeeded(box)
            return result

    async def _infer_http(self, box: Box, model: str, inputs: Sequence[Any], options: dict[str, Any]) -> Any:
        import tritonclient.http as triton_http

        assert self._session is not None
        body, json_size = triton_http.InferenceServerClient.generate_request_body(
            inputs, outputs=options["outputs"], request_id=options["request_id"], priority=options["priority"],
            timeout=options["timeout"], parameters=options["parameters"], **sequence_options(options))
        headers = headers_for(self._tokens.token_for(box), options["headers"])
        if json_size is not None:
            headers.update({"Inference-Header-Content-Length": str(json_size),
                            "Content-Type": "application/octet-stream"})
        else:
            headers["Content-Type"] = "application/json"
        headers.setdefault("Accept-Encoding", "identity")  # a LAN: compressing small answers costs more
        url = box.base_url + infer_path(model, options["model_version"])
        try:
            async with self._session.post(url, data=body, headers=headers) as response:
                data = await response.read()
                status, answer = response.status, dict(response.headers)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise Unreachable(f"{box.name}: cannot connect ({exc})", cool=True) from None
        except TimeoutError:
            raise InferenceServerException(msg=f"{box.name}: timed out waiting for the answer") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise Unreachable(f"{box.name}: connection lost before an answer ({exc})", cool=False) from None
        if status != 200:
            raise classify_http(status, data, answer, box.name)
        length = answer.get("Inference-Header-Content-Length")
        return triton_http.InferResult.from_response_body(
            data, header_length=int(length) if length else None, content_encoding=None)  # aiohttp decoded it

    async def _infer_grpc(self, box: Box, model: str, inputs: Sequence[Any], options: dict[str, Any]) -> Any:
        import tritonclient.grpc.aio as triton_grpc_aio

        url = box.grpc_url
        assert url is not None
        client = self._grpc.get(url)
        if client is None:
            client = self._grpc[url] = triton_grpc_aio.InferenceServerClient(url)
        try:
            token = self._tokens.token_for(box)
            return await client.infer(model, inputs, **grpc_options(options, self._timeout, token))
        except InferenceServerException as exc:
            raise classify_grpc(exc, box.name) from None

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._browser is not None:
            await asyncio.to_thread(self._browser.close)
            self._browser = None
        for client in self._grpc.values():
            with contextlib.suppress(Exception):
                await client.close()
        self._grpc.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None
