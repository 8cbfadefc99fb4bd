"""The Python floor: a bare aiohttp handler doing only orjson-parse + onnxruntime + orjson-dump.

Run: python -m bench.floor MODEL.onnx [--off-loop]  (prints 'PORT <n>' once listening on 127.0.0.1).
With --off-loop the handler runs onnxruntime on one worker thread (run_in_executor) instead of on the
event loop: the same thread hop the appliance makes, so the two floors bracket what the hop costs.
"""

from __future__ import annotations

import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import orjson
from aiohttp import web


def make_app(model_path: str, off_loop: bool) -> web.Application:
    session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    executor = ThreadPoolExecutor(1) if off_loop else None
    input_name = session.get_inputs()[0].name
    output_name = session.get_outputs()[0].name

    async def infer(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        tensor = body["inputs"][0]
        x = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
        if executor is None:
            (y,) = session.run([output_name], {input_name: x})
        else:
            (y,) = await asyncio.get_running_loop().run_in_executor(
                executor, session.run, [output_name], {input_name: x})
        out = {"model_name": "floor", "outputs": [
            {"name": output_name, "datatype": "FP32", "shape": list(y.shape), "data": y.ravel()}]}
        return web.Response(body=orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY),
                            content_type="application/json")

    app = web.Application(client_max_size=1 << 26)
    app.add_routes([web.post("/infer", infer)])
    return app


async def _main(model_path: str, off_loop: bool) -> None:
    runner = web.AppRunner(make_app(model_path, off_loop), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(f"PORT {runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], "--off-loop" in sys.argv[2:]))
