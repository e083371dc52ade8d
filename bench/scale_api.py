"""bench/scale.py's raw API calls: a generated client call's JSON body without the client's
model objects (`raw`), and list-then-watch on raw JSON (`follow`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp


class ApiError(RuntimeError):
    """An error status from the API server (raw calls do not raise the client's own)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    @property
    def transient(self) -> bool:
        return self.status == 429 or self.status >= 500


async def raw(call: Awaitable[Any]) -> dict[str, Any]:
    """Await a generated client call made with `_preload_content=False`; fail on an error
    status, return the JSON body. Raw JSON spares the harness the client's model objects,
    whose CPU would be taken from the components measured on the same two cores."""
    resp = await call
    try:
        data = await resp.read()
        if not 200 <= resp.status < 300:
            what = f"{resp.method} {resp.url.path}: {resp.status} {data[:300]!r}"
            raise ApiError(resp.status, what)
        body: dict[str, Any] = json.loads(data) if data else {}
        return body
    finally:
        resp.release()


async def follow(
    list_call: Callable[..., Awaitable[Any]],
    on_event: Callable[[str, dict[str, Any]], None],
    *args: Any,
) -> None:
    """List, then watch forever (raw JSON), calling `on_event(type, object)` for every object
    of the list ("ADDED") and every event; lists again when the watch expires (410) and
    retries after a transient error (e.g. a new CRD's storage still initializing)."""
    while True:
        try:
            await _follow(list_call, on_event, *args)
        except ApiError as err:
            if not err.transient:
                raise
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(1.0)


async def _follow(
    list_call: Callable[..., Awaitable[Any]],
    on_event: Callable[[str, dict[str, Any]], None],
    *args: Any,
) -> None:
    while True:
        listed = await raw(list_call(*args, _preload_content=False))
        for obj in listed["items"]:
            on_event("ADDED", obj)
        version = listed["metadata"]["resourceVersion"]
        while version:
            resp = await list_call(
                *args,
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=600,
                _preload_content=False,
            )
            try:
                if not 200 <= resp.status < 300:
                    raise ApiError(resp.status, f"watch {resp.url.path}: {resp.status}")
                async for line in resp.content:
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        version = ""  # gone: list again
                        break
                    version = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        on_event(event["type"], event["object"])
            finally:
                resp.release()
