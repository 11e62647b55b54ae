"""The host's side of the channel (admin API).

- ``GET /device-events/{id}?after=CURSOR`` (read scopes): up to 500 events after the
  cursor, oldest first, and the cursor to ask from next.
- ``GET /device-events/{id}/stream`` (or ``?follow=true``): the same as Server-Sent
  Events, first the stored ones after ``after`` (or ``Last-Event-ID``), then each new one
  as it is stored; woken by ``EventHub``, with a comment line every 15 s to keep proxies open.
- ``POST /device-messages/{id}`` (write scopes): queue the body (any bytes, up to
  ``--message-max-bytes``) for the instance to read once at ``GET /ganeti/<v>/read``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.responses import Response, StreamingResponse

from imds.services import Services
from imds.services.channel import PAGE, Channel, event_json
from imds.services.records.wire import parse_instance_id
from imds.services.render.json import encode
from imds.web.admin.auth import ID_EXTRA
from imds.web.body import read_limited
from imds.web.errors import JSON, documented

KEEPALIVE = 15.0
SSE = "text/event-stream"
Since = Annotated[int, Query(ge=0, description="return events with a cursor above this")]
StartAfter = Annotated[int, Query(ge=0, description="start after this cursor")]
Follow = Annotated[bool, Query(description="stream as Server-Sent Events")]


async def sse(channel: Channel, instance_id: str, after: int) -> AsyncIterator[bytes]:
    """Stored events after ``after``, then new ones as they come, as SSE frames."""
    cursor = after
    while True:
        wake = channel.hub.next_change(instance_id)  # before reading: no event slips between
        events = await channel.events(instance_id, cursor)
        for event in events:
            cursor = event.cursor
            yield f"id: {cursor}\nevent: event\ndata: {json.dumps(event_json(event))}\n\n".encode()
        if len(events) == PAGE:
            continue
        try:
            await asyncio.wait_for(asyncio.shield(wake), KEEPALIVE)
        except TimeoutError:
            yield b": keepalive\n\n"


def _after(request: Request, after: int) -> int:
    last = request.headers.get("last-event-id", "")
    return max(after, int(last)) if last.isdigit() else after


def channel_admin_router(services: Services) -> APIRouter:
    """The events and messages routes, bound to ``services``."""
    router = APIRouter(tags=["admin"], responses=documented(400, 401, 403, 404, 409, 413, 503))
    channel = services.channel

    events_route = partial(router.get, openapi_extra=ID_EXTRA, response_class=Response)

    async def stream(request: Request, instance_id: str, after: int, headers: dict[str, str] | None) -> Response:
        instance = parse_instance_id(instance_id)
        return StreamingResponse(sse(channel, instance, _after(request, after)), media_type=SSE, headers=headers)

    @events_route("/device-events/{instance_id}", summary="Events the instance posted, after a cursor")
    async def get_events(request: Request, instance_id: str, after: Since = 0, follow: Follow = False) -> Response:
        if follow:
            return await stream(request, instance_id, after, None)
        instance = parse_instance_id(instance_id)
        events = await channel.events(instance, after)
        body = {"id": instance, "events": [event_json(e) for e in events],
                "cursor": events[-1].cursor if events else after}
        return Response(encode(body), media_type=JSON)

    @events_route("/device-events/{instance_id}/stream", summary="Follow the instance's events (Server-Sent Events)")
    async def stream_events(request: Request, instance_id: str, after: StartAfter = 0) -> Response:
        return await stream(request, instance_id, after, {"cache-control": "no-cache"})

    @router.post("/device-messages/{instance_id}", summary="Queue a message the instance reads once",
                 openapi_extra=ID_EXTRA)
    async def post_message(request: Request, instance_id: str) -> Response:
        instance = parse_instance_id(instance_id)
        body = await read_limited(request, channel.limits.message_max_bytes)
        queued = await channel.queue(instance, body)
        return Response(encode({"id": instance, "message_id": queued, "size": len(body)}), media_type=JSON)

    return router



