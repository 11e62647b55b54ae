"""The instance's side of the channel: ``POST /events``, ``POST /phone-home``, ``/ganeti/<v>/read|write``.

The caller is found like every instance read (``Locator``). A post spends a token of the
instance's rate limit before its body is read (429 with Retry-After when none is left),
then ``imds.services.channel`` validates and stores it (a ``/ganeti`` write through
``imds.services.ganeti.install``, where ``succeeded`` ends an installation): 200 ``{"cursor": N}``, 400 naming
the bad field, 413 over ``--event-max-bytes``. ``GET /ganeti/<v>/read`` takes the oldest
message the host queued, once: 200 with its bytes, 404 when none waits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from imds.errors import ImdsError, NotFound, PayloadTooLarge
from imds.models import Event
from imds.services import Services
from imds.services.ganeti.install import report
from imds.services.render.json import encode
from imds.web.errors import error_body
from imds.web.replies import declared_over, read_body
from imds.web.routing import BINARY, JSON, InstanceCall, Locator, Pending, Receive, Reply, error_reply


def _not_allowed(allow: bytes) -> Reply:
    return Reply(405, error_body("method not allowed"), JSON, ((b"allow", allow),))


class ChannelFlavor:
    """The instance's handlers of the channel."""

    def __init__(self, services: Services, locator: Locator) -> None:
        self._channel = services.channel
        self._os = services.os
        self._locator = locator

    async def events(self, call: InstanceCall) -> Reply:
        """``POST /events`` ``{"state", "code"?, "message"?}``."""
        return await self._post(call, self._channel.post)

    async def handle_write(self, call: InstanceCall) -> Reply:
        """``POST /ganeti/<version>/write``: as ``/events``, and ``succeeded`` ends an installation (``install``)."""
        return await self._post(call, self._ganeti_write)

    async def _ganeti_write(self, instance_id: str, raw: bytes) -> Event:
        return await report(self._channel, self._os, instance_id, raw)

    async def phone_home(self, call: InstanceCall) -> Reply:
        """``POST /phone-home``: the instance booted (any body up to the size cap, e.g. cloud-init's form)."""
        return await self._post(call, self._channel.phone_home)

    async def handle_read(self, call: InstanceCall) -> Reply:
        """``GET /ganeti/<version>/read``: the oldest queued message, consumed by this read."""
        if call.scope["method"] != "GET":
            return _not_allowed(b"GET")
        try:
            instance_id = (await self._locator.entry(call)).instance.id
        except ImdsError as exc:
            return error_reply(exc)
        call.unversioned()  # a message is no instance document: no ETag, no change watch
        channel = self._channel

        async def complete(_receive: Receive) -> Reply:
            try:
                body = await channel.take(instance_id)
            except ImdsError as exc:
                return error_reply(exc)
            if body is None:
                return error_reply(NotFound(f"no message is queued for instance {instance_id}"))
            return Reply(200, body, BINARY)

        return Pending(complete=complete)

    async def _post(self, call: InstanceCall, store: Callable[[str, bytes], Awaitable[Event]]) -> Reply:
        if call.scope["method"] != "POST":
            return _not_allowed(b"POST")
        limit = self._channel.limits.event_max_bytes
        try:
            instance_id = (await self._locator.entry(call)).instance.id
            if declared_over(call.scope, limit):
                raise PayloadTooLarge(limit)
            self._channel.admit(instance_id)
        except ImdsError as exc:
            return error_reply(exc)

        async def complete(receive: Receive) -> Reply:
            try:
                event = await store(instance_id, await read_body(receive, limit, "an event"))
            except ImdsError as exc:
                return error_reply(exc)
            return Reply(200, encode({"cursor": event.cursor, "state": event.state}), JSON)

        return Pending(complete=complete)
