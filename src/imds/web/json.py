"""The Equinix JSON flavor: ``/metadata`` and ``/userdata`` (also under ``/api/v1``)."""

from __future__ import annotations

from imds.errors import ImdsError, InstanceNotFound
from imds.models import Instance
from imds.services import Services
from imds.services.render.json import metadata_bytes, userdata_bytes
from imds.web.errors import error_body, error_parts
from imds.web.routing import BINARY, JSON, READ_METHODS, TEXT, Handler, Locator, Reply, Scope

_NOT_ALLOWED = Reply(405, error_body("method not allowed"), JSON, ((b"allow", b"GET, HEAD"),))


def _userdata_type(instance: Instance) -> bytes:
    try:
        userdata_bytes(instance).decode()
    except UnicodeDecodeError:
        return BINARY
    return TEXT


class JsonFlavor:
    """Serves the stored document (plus template fields) and the userdata bytes."""

    def __init__(self, services: Services, locator: Locator) -> None:
        self._services = services
        self._locator = locator
        self._metrics = services.metrics

    def routes(self) -> dict[str, Handler]:
        """Exact paths this flavor answers."""
        routes: dict[str, Handler] = {}
        for prefix in ("", "/api/v1"):
            for name, handler in (("metadata", self.metadata), ("userdata", self.userdata)):
                routes[f"{prefix}/{name}"] = routes[f"{prefix}/{name}/"] = handler
        return routes

    def metadata(self, scope: Scope) -> Reply:
        """The caller's metadata document."""
        if scope["method"] not in READ_METHODS:
            return _NOT_ALLOWED
        try:
            entry = self._locator.entry(scope)
            templates = self._services.templates
            body = entry.render("json/metadata", lambda instance: metadata_bytes(instance, templates))
        except InstanceNotFound as exc:
            self._metrics.metadata_cache_miss.inc()
            return _error(exc)
        except ImdsError as exc:
            return _error(exc)
        self._metrics.metadata_cache_hit.inc()
        return Reply(200, body, JSON)

    def userdata(self, scope: Scope) -> Reply:
        """The caller's userdata, byte for byte."""
        if scope["method"] not in READ_METHODS:
            return _NOT_ALLOWED
        try:
            entry = self._locator.entry(scope)
            body = entry.render("json/userdata", userdata_bytes)
        except InstanceNotFound as exc:
            self._metrics.userdata_cache_miss.inc()
            return _error(exc)
        except ImdsError as exc:
            return _error(exc)
        self._metrics.userdata_cache_hit.inc()
        return Reply(200, body, entry.render("json/userdata-type", _userdata_type))


def _error(exc: ImdsError) -> Reply:
    status, body, headers = error_parts(exc)
    return Reply(status, body, JSON, tuple(headers))
