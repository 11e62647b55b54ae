"""``?wait_for_change=true&last_etag=E&timeout_sec=N`` on instance documents.

The front parses the query only when there is one, so plain reads pay nothing. A held
request costs one future held by its catalog entry (``Entry.watch``) and one timer; the catalog
resolves the future when it applies a change to the instance (a local write or the feed
follower), and the request runs its handler again. A task waiting on ``receive`` ends
the hold as soon as the client disconnects. It answers at once when ``last_etag``
differs from the current ETag, and the current value (200) when the timeout passes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import parse_qs

from imds.errors import InvalidInput
from imds.services.catalog.catalog import Entry
from imds.web.routing import InstanceCall, Receive, Reply

_TRUE = frozenset({"true", "1"})
_FALSE = frozenset({"false", "0"})


@dataclass(frozen=True)
class Watch:
    """What a change-watch request asked for."""

    last_etag: bytes | None
    timeout: float


def parse_watch(query: bytes, max_timeout: int) -> Watch | None:
    """The watch a query string asks for, None when it asks for none; InvalidInput naming a bad parameter."""
    params = parse_qs(query.decode("latin-1"), keep_blank_values=True)
    flag = params.get("wait_for_change")
    if flag is None:
        return None
    if flag[-1].lower() not in _TRUE | _FALSE:
        raise InvalidInput.one("wait_for_change", "must be true or false")
    if flag[-1].lower() in _FALSE:
        return None
    timeout = max_timeout
    if "timeout_sec" in params:
        text = params["timeout_sec"][-1]
        if not text.isdigit() or not 1 <= int(text) <= max_timeout:
            raise InvalidInput.one("timeout_sec", f"must be a whole number of seconds from 1 to {max_timeout}")
        timeout = int(text)
    last = params.get("last_etag")
    etag = None
    if last is not None:
        value = last[-1].strip().removeprefix("W/")
        etag = (value if value.startswith('"') else f'"{value}"').encode("latin-1")
    return Watch(etag, float(timeout))


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def _until_disconnect(receive: Receive) -> None:
    with contextlib.suppress(Exception):  # a server that cannot tell us: hold until change or timeout
        while (await receive())["type"] != "http.disconnect":
            pass


async def hold(
    call: InstanceCall, reply: Reply, watch: Watch, rerun: Callable[[], Awaitable[Reply]], receive: Receive
) -> Reply:
    """Wait until the caller's instance has an ETag other than ``last_etag`` (or the timeout, or a disconnect)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + watch.timeout
    entry: Entry | None = call.version
    last = watch.last_etag if watch.last_etag is not None else entry.etag if entry is not None else None
    if entry is None or reply.status != 200 or entry.etag != last:
        return reply
    current: list[asyncio.Future[None]] = []
    gone = loop.create_task(_until_disconnect(receive))  # a client that left frees its request at once
    gone.add_done_callback(lambda _task: _expire(current[-1]) if current else None)
    try:
        while entry is not None and reply.status == 200 and entry.etag == last and not gone.done():
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            waiter: asyncio.Future[None] = loop.create_future()
            current.append(waiter)
            entry.watch(waiter)
            timer = loop.call_later(remaining, _expire, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                current.clear()
                entry.unwatch(waiter)
            call.unversioned()
            reply = await rerun()
            entry = call.version
    finally:
        gone.cancel()
    return reply
