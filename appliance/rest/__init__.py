"""The HTTP layer: aiohttp routes and the KServe v2 codec. It never touches a runtime."""
