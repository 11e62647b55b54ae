"""The instance-facing hot path: a raw ASGI callable in front of the admin framework.

It finds the handler for the path in two dicts (exact paths, then the first path
segment), and the handler answers from the in-memory catalog with bytes rendered once
per version of the instance. No framework routing, middleware or validation runs here;
every other request goes to the admin app, measured by route group.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from imds import log
from imds.errors import ImdsError, RateLimited
from imds.services import Services
from imds.services.lookup import LookupNeeded
from imds.services.ratelimit import RateLimiter
from imds.web.channel import ChannelFlavor
from imds.web.ec2 import Ec2Flavor
from imds.web.errors import error_body, error_parts
from imds.web.ganeti import GanetiFlavor
from imds.web.instance_guard import FlavorGuard
from imds.web.json import JsonFlavor
from imds.web.nocloud import NoCloudFlavor
from imds.web.openstack import OpenStackFlavor
from imds.web.routing import ENTRY, JSON, LOOKED_UP, READ_METHODS, Handler, Locator, Pending, Reply, Scope
from imds.web.watch import hold, parse_watch

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_log = log.get("instance")
OPS_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
_INTERNAL = Reply(500, error_body("internal error"), JSON)
_LOADING = Reply(503, error_body("the instance catalog is still loading; see /readyz"), JSON, ((b"retry-after", b"1"),))


def _group(path: str) -> str:
    if path in OPS_PATHS:
        return "ops"
    if "/device-" in path or path in {"/docs", "/openapi.json"} or path.startswith(("/identity", "/api/v1/")):
        return "admin"
    if path.startswith("/os-definitions"):  # Ganeti OS definitions
        return "admin"
    return "other"


def _loading(_scope: Scope) -> Reply:
    return _LOADING


class InstanceFront:
    """Serves instance routes from memory; forwards every other request to ``admin``."""

    def __init__(self, services: Services, admin: ASGIApp) -> None:
        self.services = services
        self.admin = admin
        locator = Locator(
            services.catalog, services.settings.trusted_proxies, services.metrics, services.lookup, services.signed
        )
        json_flavor, ec2_flavor = JsonFlavor(services, locator), Ec2Flavor(services, locator)
        self._ec2 = ec2_flavor
        self._exact: dict[str, Handler] = {**json_flavor.routes(), **ec2_flavor.routes()}
        self._prefixes: dict[str, Handler] = {**ec2_flavor.prefixes()}
        self._prefixes.update(OpenStackFlavor(services, locator).prefixes())
        self._prefixes.update(NoCloudFlavor(services, locator).prefixes())
        self.ganeti = GanetiFlavor(services, locator)
        channel = ChannelFlavor(services, locator)  # /events, /phone-home, and /ganeti/<v>/read|write
        self.ganeti.channel.update(read=channel.handle_read, write=channel.handle_write)
        self._exact.update(channel.routes())
        self._prefixes.update(self.ganeti.prefixes())
        self._watch_max = services.settings.watch_max_timeout
        guard = FlavorGuard(services, locator)  # --instance-auth: the anti-SSRF policy per flavor
        self._exact.update(guard.wrap("json", json_flavor.routes()))
        for flavor in ("openstack", "nocloud", "ganeti"):
            self._prefixes.update(guard.wrap(flavor, {flavor: self._prefixes[flavor]}))
        self._log_reads = services.settings.log_instance_reads
        metrics = services.metrics
        self._observe = metrics.latency.labels("instance").observe
        self._counters = {s: metrics.requests.labels("instance", str(s)) for s in (200, 400, 401, 403, 404, 405)}
        settings = services.settings
        self._limiter = RateLimiter(settings.rate_limit, settings.rate_burst) if settings.rate_limit > 0 else None
        self._locator, self._behind_proxies = locator, bool(settings.trusted_proxies)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        if scope["type"] != "http":
            await self.admin(scope, receive, send)
            return
        path = scope["path"]
        handler = self._exact.get(path)
        if handler is None:
            segment = path.split("/", 2)[1] if path.count("/") > 1 else path[1:]
            handler = self._prefixes.get(segment)
            if handler is None and self._ec2.claims(segment):
                handler = self._ec2.handle
        if handler is None:
            await self._measured(scope, receive, send)
            return
        if not self.services.catalog.loaded:  # answered, never left silent, until the catalog is in memory
            handler = _loading
        await self._serve(scope, send, handler, receive)

    async def _serve(self, scope: Scope, send: Send, handler: Handler, receive: Receive) -> None:
        started = time.perf_counter()
        try:
            try:
                reply = self._limited(scope) or handler(scope)
            except LookupNeeded as need:
                reply = await self._after_lookup(scope, handler, need)
            if isinstance(reply, Pending) and reply.complete is not None:
                reply = await reply.complete(receive)  # a write that needs the body (OpenStack password)
            elif scope["query_string"]:  # change watch: parsed only when there is a query
                reply = await self._watch(scope, handler, reply, receive)
        except Exception:  # noqa: BLE001 - an instance must get an answer, never a dropped connection
            _log.exception("instance.error", path=scope["path"])
            reply = _INTERNAL
        headers = [
            *reply.headers,
            (b"content-type", reply.content_type),
            (b"content-length", str(len(reply.body)).encode()),
        ]
        entry = scope.get(ENTRY)
        if entry is not None and reply.status == 200 and scope["method"] in READ_METHODS:
            headers.append((b"etag", entry.etag))
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else reply.body})
        counter = self._counters.get(reply.status)
        (counter or self.services.metrics.requests.labels("instance", str(reply.status))).inc()
        self._observe(time.perf_counter() - started)
        if self._log_reads:
            client = scope.get("client")
            _log.info("instance.read", path=scope["path"], peer=client[0] if client else None, status=reply.status)

    def _limited(self, scope: Scope) -> Reply | None:
        """A 429 with Retry-After when the caller's address has used up its rate, else None."""
        if self._limiter is None:
            return None
        client = scope.get("client")
        key = client[0] if client else "-"
        if self._behind_proxies:
            try:
                address = self._locator.address(scope)
            except ImdsError:  # a bad X-Forwarded-For: the handler answers it (400); count it against the peer
                address = None
            key = str(address) if address is not None else key
        wait = self._limiter.retry_after(key)
        if not wait:
            return None
        status, body, headers = error_parts(RateLimited(wait))
        return Reply(status, body, JSON, tuple(headers))

    async def _run(self, scope: Scope, handler: Handler) -> Reply:
        try:
            return handler(scope)
        except LookupNeeded as need:
            return await self._after_lookup(scope, handler, need)

    async def _watch(self, scope: Scope, handler: Handler, reply: Reply, receive: Receive) -> Reply:
        """Hold the read while ``?wait_for_change=true`` asks for it (see ``imds.web.watch``)."""
        try:
            watch = parse_watch(scope["query_string"], self._watch_max)
        except ImdsError as exc:
            scope.pop(ENTRY, None)
            status, body, headers = error_parts(exc)
            return Reply(status, body, JSON, tuple(headers))
        if watch is None or ENTRY not in scope:
            return reply
        waiting = self.services.metrics.watch_waiting
        waiting.inc()
        try:
            return await hold(scope, reply, watch, lambda: self._run(scope, handler), receive)
        finally:
            waiting.dec()

    async def _after_lookup(self, scope: Scope, handler: Handler, need: LookupNeeded) -> Reply:
        """Fetch what the handler missed from upstream, then run it once more."""
        lookup = self.services.lookup
        assert lookup is not None  # noqa: S101 - the Locator raises LookupNeeded only in pull mode
        scope[LOOKED_UP] = await lookup.resolve(need) or True
        return handler(scope)

    async def _measured(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        group = _group(scope["path"])
        status = 500
        answered = False

        async def send_and_note(message: MutableMapping[str, Any]) -> None:
            nonlocal status, answered
            if message["type"] == "http.response.start":
                status, answered = message["status"], True
            await send(message)

        try:
            await self.admin(scope, receive, send_and_note)
        except Exception:  # noqa: BLE001 - logged here once, with its traceback; the answer was a 500
            _log.exception("admin.error", method=scope.get("method"), path=scope["path"], group=group)
            if not answered:
                await send({"type": "http.response.start", "status": 500, "headers": [(b"content-type", JSON)]})
                await send({"type": "http.response.body", "body": error_body("internal error")})
        finally:
            metrics = self.services.metrics
            metrics.requests.labels(group, str(status)).inc()
            metrics.latency.labels(group).observe(time.perf_counter() - started)
