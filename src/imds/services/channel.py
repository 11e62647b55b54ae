"""The instance<->host channel: events and phone-home up, messages down.

- An instance posts ``{"state", "code"?, "message"?}`` (``/events``, ``/ganeti/<v>/write``)
  or phones home (``/phone-home``: an event whose state is ``booted``). Each instance has
  a token bucket per replica (``--event-rate``, ``--event-burst``); a post over it is
  ``RateLimited`` (429 with Retry-After). Events are stored with a per-instance cursor
  and the newest ``--event-retain`` are kept.
- The host reads them by cursor, or follows them: ``EventHub`` wakes followers when an
  event is stored on this replica, and one task per replica (not one per follower) polls
  the store's newest cursor to wake them for events stored through other replicas.
- The host queues messages; the instance takes each exactly once (one transaction).
- An event ``{"state": "notice-ack", "message": "<notice id>"}`` acknowledges a lifecycle
  notice (``acknowledge``: ``imds.services.notices.records``) before it is stored: one the
  instance may not acknowledge is refused (404, 409) and not stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from imds import log
from imds.config.settings import ChannelSettings
from imds.errors import Conflict, InvalidInput, NotFound, PayloadTooLarge, Problem, StoreUnavailable
from imds.models import Event
from imds.services.admission.ratelimit import RateLimiter
from imds.services.records.limits import NOT_TEXT, valid_text
from imds.store.interface import Store

_log = log.get("channel")
BOOTED = "booted"
NOTICE_ACK = "notice-ack"  # an instance acknowledges the notice its message names
HOST_STATES = frozenset({"mode"})  # written by imds itself (imds.services.ganeti.install), never by an instance
_STATE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")  # fullmatch: "mode\n" must not pass as a state
_FIELDS = frozenset({"state", "code", "message"})
PAGE = 500  # events per page of GET /device-events/{id}


def parse_event(raw: bytes, limit: int) -> tuple[str, int | None, str | None]:
    """``{"state", "code"?, "message"?}`` → its fields, or InvalidInput naming each bad field."""
    if len(raw) > limit:
        raise PayloadTooLarge(limit)
    try:
        body: Any = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput.one("body", f"not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidInput.one("body", 'must be a JSON object: {"state", "code"?, "message"?}')
    problems = [Problem(name, "unknown field") for name in sorted(set(body) - _FIELDS)]
    state, code, message = body.get("state"), body.get("code"), body.get("message")
    if not isinstance(state, str) or not _STATE.fullmatch(state):
        problems.append(Problem("state", "is required: 1 to 64 of A-Z a-z 0-9 _ . : -"))
    if code is not None and (isinstance(code, bool) or not isinstance(code, int) or not -(2**31) <= code < 2**31):
        problems.append(Problem("code", "must be a 32-bit integer"))
    if message is not None and not isinstance(message, str):
        problems.append(Problem("message", "must be a string"))
    elif message is not None and not valid_text(message):
        problems.append(Problem("message", NOT_TEXT))
    if problems:
        raise InvalidInput(problems)
    return str(state), code, message


def event_json(event: Event) -> dict[str, Any]:
    """The wire form of an event (admin API, SSE, CLI)."""
    return {
        "cursor": event.cursor,
        "instance_id": event.instance_id,
        "state": event.state,
        "code": event.code,
        "message": event.message,
        "created_at": event.created_at.isoformat(),
    }


class EventHub:
    """Wakes the followers of an instance's events; no polling loop per follower."""

    def __init__(self, store: Store, poll_interval: float) -> None:
        self._store = store
        self._poll_interval = poll_interval
        self._next: dict[str, asyncio.Future[None]] = {}
        self._seen = 0

    def next_change(self, instance_id: str) -> asyncio.Future[None]:
        """A future resolved when the instance may have a new event (shared by its followers)."""
        future = self._next.get(instance_id)
        if future is None or future.done():
            future = self._next[instance_id] = asyncio.get_running_loop().create_future()
        return future

    def notify(self, instance_id: str) -> None:
        """Wake the instance's followers."""
        future = self._next.pop(instance_id, None)
        if future is not None and not future.done():
            future.set_result(None)

    async def follow(self) -> None:
        """Poll the newest cursor while anyone follows; wake everyone when it moved (other replicas)."""
        with contextlib.suppress(StoreUnavailable):
            self._seen = await self._store.latest_event_cursor()
        while True:
            await asyncio.sleep(self._poll_interval)
            if not self._next:
                continue
            with contextlib.suppress(StoreUnavailable):
                latest = await self._store.latest_event_cursor()
                if latest != self._seen:
                    self._seen = latest
                    for instance_id in list(self._next):
                        self.notify(instance_id)


class Channel:
    """Events and messages, over the store."""

    def __init__(
        self, store: Store, limits: ChannelSettings, hub: EventHub, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._store = store
        self.limits = limits
        self.hub = hub
        self.limiter = RateLimiter(limits.event_rate, limits.event_burst, clock)
        # Records an acknowledgement (instance id, the event's message), raising when it may not be given.
        self.acknowledge: Callable[[str, str | None], Awaitable[object]] | None = None

    def admit(self, instance_id: str) -> None:
        """Spend one of the instance's tokens (RateLimited when there is none): before reading the body."""
        self.limiter.take(instance_id)

    async def post(self, instance_id: str, raw: bytes) -> Event:
        """Store the event the instance posted (already admitted)."""
        state, code, message = parse_event(raw, self.limits.event_max_bytes)
        if state in HOST_STATES:
            raise InvalidInput.one("state", f"{state!r} is written by imds itself, not by an instance")
        if state == NOTICE_ACK and self.acknowledge is not None:
            await self.acknowledge(instance_id, message)
        return await self._append(instance_id, state, code, message)

    async def host_event(self, instance_id: str, state: str, message: str | None) -> Event:
        """Store an event imds itself writes into the instance's stream (no rate limit; see ``HOST_STATES``)."""
        return await self._append(instance_id, state, None, message)

    async def phone_home(self, instance_id: str, raw: bytes) -> Event:
        """The instance says it booted; its body (cloud-init's form fields, or anything) is not kept."""
        if len(raw) > self.limits.event_max_bytes:
            raise PayloadTooLarge(self.limits.event_max_bytes)
        return await self._append(instance_id, BOOTED, None, None)

    async def _append(self, instance_id: str, state: str, code: int | None, message: str | None) -> Event:
        event = await self._store.append_event(instance_id, state, code, message, retain=self.limits.event_retain)
        _log.info("event.posted", instance_id=instance_id, state=state, code=code, cursor=event.cursor)
        self.hub.notify(instance_id)
        return event

    async def events(self, instance_id: str, after: int, limit: int = PAGE) -> list[Event]:
        """The instance's events after ``after``, oldest first."""
        return await self._store.events_after(instance_id, after, limit)

    async def queue(self, instance_id: str, body: bytes) -> int:
        """Queue a message for the instance; Conflict when too many wait."""
        if len(body) > self.limits.message_max_bytes:
            raise PayloadTooLarge(self.limits.message_max_bytes)
        if await self._store.get(instance_id) is None:
            raise NotFound(f"no instance {instance_id}")
        queued = await self._store.queue_message(instance_id, body, max_queued=self.limits.message_max_queued)
        if queued is None:
            msg = f"instance {instance_id} already has {self.limits.message_max_queued} unread messages"
            raise Conflict(msg)
        _log.info("message.queued", instance_id=instance_id, size=len(body), id=queued)
        return queued

    async def take(self, instance_id: str) -> bytes | None:
        """The instance's oldest message, removed as it is returned; None when none waits."""
        return await self._store.take_message(instance_id)
