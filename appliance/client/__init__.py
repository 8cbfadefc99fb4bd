"""For apps: find appliances on the LAN and send requests to the box best placed to answer them.

    from appliance.client import BoxPool, discover
    with BoxPool() as pool:                                       # follows the LAN's boxes (mDNS)
        result = pool.infer("mlp", inputs)                        # tritonclient.http inputs and result
    BoxPool(protocol="grpc")                                      # or over gRPC
    async with AsyncBoxPool() as pool: await pool.infer(...)      # asyncio
    boxes = discover(timeout=3)                                   # one look at the LAN
    client = tritonclient.http.InferenceServerClient(boxes[0].url)
"""

from appliance.client.aio import AsyncBoxPool
from appliance.client.boxes import PROTOCOLS, Box, Browser, discover
from appliance.client.pool import BoxPool
from appliance.client.routing import NoBoxAvailable

__all__ = ["PROTOCOLS", "AsyncBoxPool", "Box", "BoxPool", "Browser", "NoBoxAvailable", "discover"]
