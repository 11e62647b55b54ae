"""The instance-facing hot path: a raw ASGI callable in front of the admin framework.

It matches the request path against a dict of instance routes, identifies the caller
from the socket (and trusted proxies), looks it up in the in-memory catalog and sends
bytes rendered once per version of the instance. No framework routing, middleware or
validation runs here; everything else goes to the admin app, measured by route group.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from imds import log
from imds.errors import ImdsError, InstanceNotFound
from imds.models import Instance
from imds.services import Services
from imds.services.catalog import Entry
from imds.services.identify import caller_address
from imds.services.render.json import metadata_bytes, userdata_bytes
from imds.web.errors import JSON, error_body, error_parts

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Route = Callable[[Entry], tuple[bytes, bytes]]

_log = log.get("instance")
OPS_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
_TEXT = b"text/plain; charset=utf-8"
_BINARY = b"application/octet-stream"


def _group(path: str) -> str:
    if path in OPS_PATHS:
        return "ops"
    if "/device-" in path or path in {"/docs", "/openapi.json"}:
        return "admin"
    return "other"


class InstanceFront:
    """Serves instance routes from memory; forwards every other request to ``admin``."""

    def __init__(self, services: Services, admin: ASGIApp) -> None:
        self.services = services
        self.admin = admin
        self._catalog = services.catalog
        self._trusted = services.settings.trusted_proxies
        self._log_reads = services.settings.log_instance_reads
        metrics = services.metrics
        self._observe = metrics.latency.labels("instance").observe
        self._counters = {s: metrics.requests.labels("instance", str(s)) for s in (200, 400, 404, 405, 500, 503)}
        self._routes: dict[str, tuple[str, Route]] = {}
        for prefix in ("", "/api/v1"):
            for name, route in (("metadata", self._metadata), ("userdata", self._userdata)):
                self._routes[f"{prefix}/{name}"] = self._routes[f"{prefix}/{name}/"] = (name, route)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        if scope["type"] == "http":
            found = self._routes.get(scope["path"])
            if found is not None:
                await self._serve(scope, send, *found)
                return
            await self._measured(scope, receive, send)
            return
        await self.admin(scope, receive, send)

    async def _serve(self, scope: Scope, send: Send, name: str, route: Route) -> None:
        started = time.perf_counter()
        headers: list[tuple[bytes, bytes]] = []
        address = None
        if scope["method"] not in {"GET", "HEAD"}:
            status, body, content_type = 405, error_body("method not allowed"), JSON.encode()
            headers.append((b"allow", b"GET, HEAD"))
        else:
            try:
                address = self._caller(scope)
                entry = self._catalog.lookup(address) if address is not None else None
                if entry is None:
                    self._miss(name)
                    raise InstanceNotFound(str(address) if address is not None else None)
                body, content_type = route(entry)
                status = 200
            except ImdsError as exc:
                status, body, headers = error_parts(exc)
                content_type = JSON.encode()
        headers += [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})
        counter = self._counters.get(status)
        (counter or self.services.metrics.requests.labels("instance", str(status))).inc()
        self._observe(time.perf_counter() - started)
        if self._log_reads:
            _log.info("instance.read", route=name, caller=str(address), status=status)

    def _caller(self, scope: Scope) -> Any:
        client = scope.get("client")
        peer = client[0] if client else None
        if not self._trusted:
            return caller_address(peer, (), ())
        forwarded = [v.decode("latin-1") for k, v in scope["headers"] if k == b"x-forwarded-for"]
        return caller_address(peer, forwarded, self._trusted)

    def _miss(self, name: str) -> None:
        metrics = self.services.metrics
        (metrics.metadata_cache_miss if name == "metadata" else metrics.userdata_cache_miss).inc()

    def _metadata(self, entry: Entry) -> tuple[bytes, bytes]:
        templates = self.services.templates
        body = entry.render("json/metadata", lambda instance: metadata_bytes(instance, templates))
        self.services.metrics.metadata_cache_hit.inc()
        return body, JSON.encode()

    def _userdata(self, entry: Entry) -> tuple[bytes, bytes]:
        body = entry.render("json/userdata", userdata_bytes)
        content_type = entry.render("json/userdata:type", _userdata_type)
        self.services.metrics.userdata_cache_hit.inc()
        return body, content_type

    async def _measured(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        group = _group(scope["path"])
        status = 500

        async def send_and_note(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.admin(scope, receive, send_and_note)
        finally:
            metrics = self.services.metrics
            metrics.requests.labels(group, str(status)).inc()
            metrics.latency.labels(group).observe(time.perf_counter() - started)


def _userdata_type(instance: Instance) -> bytes:
    data = userdata_bytes(instance)
    try:
        data.decode()
    except UnicodeDecodeError:
        return _BINARY
    return _TEXT


