"""The instance-facing hot path: a raw ASGI callable in front of the admin framework.

It finds the handler for the path in two dicts (exact paths, then the first path
segment), and the handler answers from the in-memory catalog with bytes rendered once
per version of the instance. No framework routing, middleware or validation runs here.
The admin upserts (``POST /device-metadata`` and ``/device-userdata``, the write path at
fleet rates) are called directly too; every other request goes to the admin app. Both
are measured by route group.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.requests import Request

from imds import log
from imds.errors import ImdsError, NotFound, RateLimited, SourceBusy
from imds.services import Services
from imds.services.admission.ratelimit import InFlight, RateLimiter
from imds.services.catalog.resolve import Resolver
from imds.web.admin.push import Endpoint, upsert_endpoints
from imds.web.errors import error_body, error_parts, handle_imds_error
from imds.web.flavors.channel import ChannelFlavor
from imds.web.flavors.ec2 import Ec2Flavor
from imds.web.flavors.ganeti import GanetiFlavor
from imds.web.flavors.json import JsonFlavor
from imds.web.flavors.nocloud import NoCloudFlavor
from imds.web.flavors.openstack import OpenStackFlavor
from imds.web.instance_guard import FlavorGuard
from imds.web.listeners import AdminListeners
from imds.web.routing import ENTRY, JSON, READ_METHODS, Handler, Locator, Pending, Reply, Scope
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


async def _loading(_scope: Scope) -> Reply:
    return _LOADING


def _error_reply(exc: ImdsError) -> Reply:
    status, body, headers = error_parts(exc)
    return Reply(status, body, JSON, tuple(headers))


_NOT_HERE = _error_reply(NotFound("not found"))
PROBE_PATHS = frozenset({"/healthz", "/readyz"})  # answered on every listener (health checks)


async def _not_here(_scope: Scope) -> Reply:
    return _NOT_HERE


def _busy(limit: int) -> Handler:
    """A handler answering 429: the caller already has ``limit`` requests in flight."""
    reply = _error_reply(SourceBusy(limit))

    async def busy(_scope: Scope) -> Reply:
        return reply

    return busy


def _direct(endpoint: Endpoint) -> ASGIApp:
    """An admin endpoint as an ASGI app of its own: no framework routing on the way in.

    An ImdsError becomes its JSON answer exactly as the admin app's handler makes it; any
    other exception reaches ``_measured`` (logged, 500).
    """

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            response = await endpoint(request)
        except ImdsError as exc:
            response = await handle_imds_error(request, exc)
        await response(scope, receive, send)

    return app


class InstanceFront:
    """Serves instance routes from memory; forwards every other request to ``admin``."""

    def __init__(self, services: Services, admin: ASGIApp) -> None:
        self.services = services
        self.admin = admin
        resolver = Resolver(services.catalog, services.metrics, services.lookup)
        locator = Locator(resolver, services.settings.callers.trusted_proxy, services.signed)
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
        self._watch_max = services.settings.channel.watch_max_timeout
        guard = FlavorGuard(services, locator)  # --instance-auth: the anti-SSRF policy per flavor
        self._exact.update(guard.wrap("json", json_flavor.routes()))
        for flavor in ("openstack", "nocloud", "ganeti"):
            self._prefixes.update(guard.wrap(flavor, {flavor: self._prefixes[flavor]}))
        self._log_reads = services.settings.logging.log_instance_reads
        metrics = services.metrics
        self._tally = metrics.tally.group("instance")  # plain ints: no lock per request (imds.tally)
        callers = services.settings.callers
        self._limiter = RateLimiter(callers.rate_limit, callers.rate_burst) if callers.rate_limit > 0 else None
        self._locator, self._behind_proxies = locator, bool(callers.trusted_proxy)
        self._in_flight = InFlight(callers.max_requests_per_source)
        admin_listen = services.settings.http.admin_listen
        self._admin_listeners = AdminListeners(admin_listen) if admin_listen else None
        upserts = {path: _direct(endpoint) for path, endpoint in upsert_endpoints(services).items()}
        self._upserts = {**upserts, **{f"/api/v1{path}": app for path, app in upserts.items()}}

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
        if self._admin_listeners is not None and self._elsewhere(scope, instance_path=handler is not None):
            handler = _not_here
        elif handler is None:
            direct = self._upserts.get(path) if scope["method"] == "POST" else None
            await self._measured(scope, receive, send, direct or self.admin)
            return
        elif not self.services.catalog.loaded:  # answered, never left silent, until the catalog is in memory
            handler = _loading
        await self._serve(scope, send, handler, receive)

    def _elsewhere(self, scope: Scope, *, instance_path: bool) -> bool:
        """With ``--admin-listen``: an instance path on an admin listener, or an admin path on an instance one."""
        assert self._admin_listeners is not None  # noqa: S101 - only called when set
        if self._admin_listeners.serves(scope):
            return instance_path
        return not instance_path and scope["path"] not in PROBE_PATHS

    async def _serve(self, scope: Scope, send: Send, handler: Handler, receive: Receive) -> None:
        if not self._in_flight.limit and self._limiter is None:
            await self._answer(scope, send, handler, receive, None)
            return
        key = self._caller_key(scope)
        if not self._in_flight.enter(key):
            await self._answer(scope, send, _busy(self._in_flight.limit), receive, None)
            return
        try:
            await self._answer(scope, send, handler, receive, key)
        finally:  # every way out (an error, a cancelled watch, a client gone) gives the slot back
            self._in_flight.leave(key)

    async def _answer(self, scope: Scope, send: Send, handler: Handler, receive: Receive, key: str | None) -> None:
        started = time.perf_counter()
        try:
            reply = self._limited(key) or await handler(scope)
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
        self._tally.add(reply.status, time.perf_counter() - started)
        if self._log_reads:
            client = scope.get("client")
            _log.info("instance.read", path=scope["path"], peer=client[0] if client else None, status=reply.status)

    def _caller_key(self, scope: Scope) -> str:
        """The caller's address: the socket peer, or the forwarded caller when the peer is a trusted proxy."""
        client = scope.get("client")
        key: str = client[0] if client else "-"
        if self._behind_proxies:
            try:
                address = self._locator.address(scope)
            except ImdsError:  # a bad X-Forwarded-For: the handler answers it (400); count it against the peer
                address = None
            key = str(address) if address is not None else key
        return key

    def _limited(self, key: str | None) -> Reply | None:
        """A 429 with Retry-After when the caller's address has used up its rate, else None."""
        if self._limiter is None or key is None:
            return None
        wait = self._limiter.retry_after(key)
        return _error_reply(RateLimited(wait)) if wait else None

    async def _watch(self, scope: Scope, handler: Handler, reply: Reply, receive: Receive) -> Reply:
        """Hold the read while ``?wait_for_change=true`` asks for it (see ``imds.web.watch``)."""
        try:
            watch = parse_watch(scope["query_string"], self._watch_max)
        except ImdsError as exc:
            scope.pop(ENTRY, None)
            return _error_reply(exc)
        if watch is None or ENTRY not in scope:
            return reply
        waiting = self.services.metrics.watch_waiting
        waiting.inc()
        try:
            return await hold(scope, reply, watch, lambda: handler(scope), receive)
        finally:
            waiting.dec()

    async def _measured(self, scope: Scope, receive: Receive, send: Send, app: ASGIApp) -> None:
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
            await app(scope, receive, send_and_note)
        except Exception:  # noqa: BLE001 - logged here once, with its traceback; the answer was a 500
            _log.exception("admin.error", method=scope.get("method"), path=scope["path"], group=group)
            if not answered:
                await send({"type": "http.response.start", "status": 500, "headers": [(b"content-type", JSON)]})
                await send({"type": "http.response.body", "body": error_body("internal error")})
        finally:
            self.services.metrics.tally.group(group).add(status, time.perf_counter() - started)
