"""The Equinix JSON flavor: ``/metadata`` and ``/userdata`` (also under ``/api/v1``)."""

from __future__ import annotations

from collections.abc import Callable

from imds.errors import ImdsError
from imds.models import METADATA, USERDATA, Instance
from imds.services import Services
from imds.services.render.json import metadata_bytes, userdata_bytes
from imds.web.errors import error_body, error_parts
from imds.web.replies import userdata_type
from imds.web.routing import JSON, READ_METHODS, Handler, Locator, Reply, Scope

_NOT_ALLOWED = Reply(405, error_body("method not allowed"), JSON, ((b"allow", b"GET, HEAD"),))


class JsonFlavor:
    """Serves the stored document (plus template fields) and the userdata bytes."""

    def __init__(self, services: Services, locator: Locator) -> None:
        self._services = services
        self._locator = locator

    def routes(self) -> dict[str, Handler]:
        """Exact paths this flavor answers."""
        routes: dict[str, Handler] = {}
        for prefix in ("", "/api/v1"):
            for name, handler in (("metadata", self.metadata), ("userdata", self.userdata)):
                routes[f"{prefix}/{name}"] = routes[f"{prefix}/{name}/"] = handler
        return routes

    async def metadata(self, scope: Scope) -> Reply:
        """The caller's metadata document."""
        templates = self._services.templates
        return await self._serve(scope, METADATA, lambda instance: metadata_bytes(instance, templates), _json_type)

    async def userdata(self, scope: Scope) -> Reply:
        """The caller's userdata, byte for byte."""
        return await self._serve(scope, USERDATA, userdata_bytes, userdata_type)

    async def _serve(
        self, scope: Scope, kind: str, build: Callable[[Instance], bytes], content_type: Callable[[Instance], bytes]
    ) -> Reply:
        if scope["method"] not in READ_METHODS:
            return _NOT_ALLOWED
        try:
            entry = await self._locator.entry(scope, kind, needs_record=True)
            body = entry.render(f"json/{kind}", build)
        except ImdsError as exc:
            return _error(exc)
        self._locator.served(kind)
        return Reply(200, body, entry.render(f"json/{kind}:type", content_type))


def _json_type(_instance: Instance) -> bytes:
    return JSON


def _error(exc: ImdsError) -> Reply:
    status, body, headers = error_parts(exc)
    return Reply(status, body, JSON, tuple(headers))
