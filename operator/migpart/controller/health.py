"""`/metrics`, `/healthz` and `/readyz` on one port (aiohttp, which kopf already brings).

`/healthz` answers while the process runs; `/readyz` once kopf has started its watches.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


async def serve(
    port: int, registry: CollectorRegistry, ready: asyncio.Event, host: str = "0.0.0.0"
) -> web.AppRunner:
    """Start serving; the caller cleans the returned runner up."""

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        if ready.is_set():
            return web.Response(text="ok")
        return web.Response(status=503, text="starting")

    app = web.Application()
    app.add_routes(
        [web.get("/metrics", metrics), web.get("/healthz", healthz), web.get("/readyz", readyz)]
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
