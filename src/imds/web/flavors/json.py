"""The Equinix JSON flavor: ``/metadata``, ``/userdata`` and ``/notices`` (also under ``/api/v1``: ``imds.web.routes``).

``/notices`` is the lifecycle notices reaching the caller (``imds.services.render.events``):
``{"notices": [current…], "history": [canceled and completed…]}``, watchable like every
instance document (``?wait_for_change=true``).
"""

from __future__ import annotations

from collections.abc import Callable

from imds.errors import ImdsError
from imds.models import METADATA, USERDATA, Instance
from imds.services import Services
from imds.services.render.events import notices_document
from imds.services.render.json import metadata_bytes, userdata_bytes
from imds.web.errors import error_body
from imds.web.replies import userdata_type
from imds.web.routing import JSON, READ_METHODS, InstanceCall, Locator, Reply, error_reply

_NOT_ALLOWED = Reply(405, error_body("method not allowed"), JSON, ((b"allow", b"GET, HEAD"),))


class JsonFlavor:
    """Serves the stored document (plus template fields) and the userdata bytes."""

    def __init__(self, services: Services, locator: Locator) -> None:
        self._locator = locator
        templates = services.templates
        self._metadata_bytes: Callable[[Instance], bytes] = lambda instance: metadata_bytes(
            instance, templates, served=True)

    async def metadata(self, call: InstanceCall) -> Reply:
        """The caller's metadata document."""
        return await self._serve(call, METADATA, self._metadata_bytes, _json_type)

    async def userdata(self, call: InstanceCall) -> Reply:
        """The caller's userdata, byte for byte."""
        return await self._serve(call, USERDATA, userdata_bytes, userdata_type)

    async def notices(self, call: InstanceCall) -> Reply:
        """The lifecycle notices reaching the caller (a document every instance has, even with none)."""
        if call.scope["method"] not in READ_METHODS:
            return _NOT_ALLOWED
        try:
            entry = await self._locator.entry(call)
            body = entry.render_in_context("json/notices", lambda _instance, context: notices_document(context))
        except ImdsError as exc:
            return error_reply(exc)
        return Reply(200, body, JSON, fixed=True)  # not recalled past the next moment a notice changes on its own

    async def _serve(
        self, call: InstanceCall, kind: str, build: Callable[[Instance], bytes],
        content_type: Callable[[Instance], bytes],
    ) -> Reply:
        if call.scope["method"] not in READ_METHODS:
            return _NOT_ALLOWED
        try:
            entry = await self._locator.entry(call, kind, needs_record=True)
            body = entry.render(f"json/{kind}", build)
        except ImdsError as exc:
            return error_reply(exc)
        self._locator.served(kind)
        return Reply(200, body, entry.render(f"json/{kind}:type", content_type), fixed=True)


def _json_type(_instance: Instance) -> bytes:
    return JSON
