"""The instance-facing hot path: a raw ASGI callable in front of the admin framework.

It finds the handler for the path in two dicts (exact paths, then the first path
segment) built once from the route table (``imds.web.routes``), makes the request's
``InstanceCall`` and hands it to the handler, which answers from the in-memory catalog
with bytes rendered once per version of the instance. No framework routing, middleware
or validation runs here.
The admin upserts (``POST /device-metadata`` and ``/device-userdata``, the write path at
fleet rates) are called directly too; every other request goes to the admin app. Both
are measured by route group.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, MutableMapping
from typing import Any, cast

from starlette.requests import Request

from imds import log
from imds.errors import ImdsError, NotFound, RateLimited, SourceBusy
from imds.models import Address
from imds.services import Services
from imds.services.admission.ratelimit import InFlight, RateLimiter
from imds.services.catalog.addresses import parse_host
from imds.services.lookup.resolve import Resolver
from imds.web.admin.push import Endpoint, upsert_endpoints
from imds.web.answers import AnswersAhead
from imds.web.errors import error_body, handle_imds_error
from imds.web.flavors.channel import ChannelFlavor
from imds.web.flavors.ec2 import Ec2Flavor, memo_path
from imds.web.flavors.ganeti import GanetiFlavor
from imds.web.flavors.gce import FLAVOR, GceFlavor
from imds.web.flavors.json import JsonFlavor
from imds.web.flavors.nocloud import NoCloudFlavor
from imds.web.flavors.openstack import OpenStackFlavor
from imds.web.instance_guard import FlavorGuard
from imds.web.listeners import AdminListeners
from imds.web.memo import Read, ReadMemo, Remembered
from imds.web.replies import reply_head
from imds.web.routes import INSTANCE, PROBE_PATHS, PUBLISHED_PATHS, Groups, aliased, dispatch, on_gce_path
from imds.web.routing import (
    JSON,
    READ_METHODS,
    Handler,
    InstanceCall,
    Locator,
    Pending,
    Reply,
    Scope,
    Streamed,
    error_reply,
)
from imds.web.watch import hold, parse_watch

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_log = log.get("instance")
_INTERNAL = Reply(500, error_body("internal error"), JSON)
_LOADING = Reply(503, error_body("the instance catalog is still loading; see /readyz"), JSON, ((b"retry-after", b"1"),))


def _own(call: InstanceCall, reply: Reply) -> Reply:
    """One of the front's own answers (429, 503, 500): on GCE's paths it says ``Metadata-Flavor: Google`` too.

    Only the refusals pay for the check: a handler's answer is the flavor's own.
    """
    if on_gce_path(call.scope["path"]):
        return dataclasses.replace(reply, headers=(*reply.headers, FLAVOR))
    return reply


async def _loading(call: InstanceCall) -> Reply:
    return _own(call, _LOADING)


_NOT_HERE = error_reply(NotFound("not found"))


async def _not_here(_call: InstanceCall) -> Reply:
    return _NOT_HERE


class _StreamAborted(BaseException):
    """A streamed reply failed after its headers went out; it reaches the server, which aborts the connection.

    A ``BaseException``, so ``_answer``'s catch-all (which turns errors into a 500) lets it through.
    """


def _busy(limit: int) -> Handler:
    """A handler answering 429: the caller already has ``limit`` requests in flight."""
    reply = error_reply(SourceBusy(limit))

    async def busy(call: InstanceCall) -> Reply:
        return _own(call, reply)

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


def _keepable(scope: Scope, memo: ReadMemo) -> Read | None:
    """The key a fixed answer to this request is kept under (``imds.web.memo``) and its gated header, or None: never."""
    if scope["method"] not in READ_METHODS or scope["query_string"]:
        return None
    return memo.key(scope["path"], scope["headers"])


class InstanceFront:
    """Serves instance routes from memory; forwards every other request to ``admin``.

    ``admin_routes``: the admin app's routes (method, path), whose paths make a request's metric group ``admin``.
    """

    def __init__(self, services: Services, admin: ASGIApp, admin_routes: Iterable[tuple[str, str]] = ()) -> None:
        self.services = services
        self.admin = admin
        resolver = Resolver(services.catalog, services.metrics, services.lookup)
        locator = Locator(resolver, services.settings.callers.trusted_proxy, services.signed)
        self._ec2 = Ec2Flavor(services, locator)
        self.mints = self._ec2.mints  # a bodiless PUT there: imds.cli.front serves it in place, as a read
        channel = ChannelFlavor(services, locator)  # /events, /phone-home, and /ganeti/<v>/read|write
        self.ganeti = GanetiFlavor(services, locator, {"read": channel.handle_read, "write": channel.handle_write})
        flavors = {"json": JsonFlavor(services, locator), "ec2": self._ec2, "channel": channel, "ganeti": self.ganeti,
                   "openstack": OpenStackFlavor(services, locator), "nocloud": NoCloudFlavor(services, locator),
                   "gce": GceFlavor(services, locator)}
        guard = FlavorGuard(services, locator)  # --instance-auth: the anti-SSRF policy of the guarded routes
        self._exact, self._prefixes = dispatch(flavors, guard.wrap)
        self.admin_routes = frozenset(admin_routes)
        self._groups = Groups({path for _, path in self.admin_routes})
        self._watch_max = services.settings.channel.watch_max_timeout
        self._log_reads = services.settings.logging.log_instance_reads
        metrics = services.metrics
        self._tally = metrics.tally.group(INSTANCE)  # plain ints: no lock per request (imds.tally)
        services.catalog.ahead.activity = metrics.tally.answered  # renderings built ahead while nothing is answered
        callers = services.settings.callers
        self._limiter = RateLimiter(callers.rate_limit, callers.rate_burst) if callers.rate_limit > 0 else None
        self._locator, self._behind_proxies = locator, bool(callers.trusted_proxy)
        self._in_flight = InFlight(callers.max_requests_per_source)
        admin_listen = services.settings.http.admin_listen
        self._admin_listeners = AdminListeners(admin_listen) if admin_listen else None
        # Repeated fixed reads answered whole (imds.web.memo); not in pull mode, whose caches are per kind.
        # A read carrying an IMDSv2 token is recalled through the EC2 flavor's gate (``Ec2Flavor.gate``).
        self._memo = (ReadMemo(resolver, services.catalog, metrics.tally, callers.trusted_proxy,
                               frozenset({self._ec2.gate.header}), alias=memo_path)
                      if services.lookup is None else None)
        if self._memo is not None:  # after the EC2 flavor's builder: its answers read the tree that one renders
            services.catalog.ahead.builders.append(AnswersAhead(self._memo, self._ec2.ahead_reads, self.prepare))
        upserts = {path: _direct(endpoint) for path, endpoint in upsert_endpoints(services).items()}
        self._upserts = {alias: app for path, app in upserts.items() for alias in aliased(path)}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        if scope["type"] != "http":
            await self.admin(scope, receive, send)
            return
        handler = self.route(scope)
        if handler is None:
            direct = self._upserts.get(scope["path"]) if scope["method"] == "POST" else None
            await self._measured(scope, receive, send, direct or self.admin)
            return
        await self.serve(scope, send, handler, receive)

    def route(self, scope: Scope) -> Handler | None:
        """The handler answering an HTTP request as an instance request, or None: the admin app's.

        The front's whole dispatch: the instance routes, the ``--admin-listen`` split and the
        503 while the catalog loads. ``imds.cli.front`` asks it too, to answer instance
        requests without an ASGI server in between.
        """
        path = scope["path"]
        handler = self._exact.get(path)
        if handler is None:
            segment = path.split("/", 2)[1] if path.count("/") > 1 else path[1:]  # routes.first_segment, inlined
            handler = self._prefixes.get(segment)
            if handler is None and self._ec2.claims(segment):
                handler = self._ec2.handle
        if self._admin_listeners is not None and self._elsewhere(scope, instance_path=handler is not None):
            return _not_here
        if handler is not None and not self.services.catalog.loaded:  # answered, never silent, until loaded
            return _loading
        return handler

    def instance_listener(self, server: tuple[str, int] | None) -> bool:
        """Whether a connection accepted on local address ``server`` carries instance requests (no admin listener)."""
        return self._admin_listeners is None or not self._admin_listeners.serves({"server": server})

    def _elsewhere(self, scope: Scope, *, instance_path: bool) -> bool:
        """With ``--admin-listen``: an instance path on an admin listener, or an admin path on an instance one."""
        assert self._admin_listeners is not None  # noqa: S101 - only called when set
        if self._admin_listeners.serves(scope):
            return instance_path and scope["path"] not in PUBLISHED_PATHS
        return not instance_path and scope["path"] not in PROBE_PATHS

    async def serve(self, scope: Scope, send: Send, handler: Handler, receive: Receive) -> None:
        """Answer an instance request with ``handler`` (from ``route``): limits, reply, ETag, tally, read log.

        Every server runs the same coroutine: ASGI servers through ``__call__``, imds's own
        front (``imds.cli.front``) directly, running it eagerly up to its first wait. So code
        here and in the handlers must not need ``asyncio.current_task()`` before it first
        waits (a Pending reply's completion is moved to a task of its own, see ``_answer``).
        """
        if self._memo is not None and not scope["query_string"] and handler not in (_not_here, _loading):
            found = self.remembered(scope.get("client"), scope["path"], scope["method"], scope["headers"])
            if found is not None:
                await send({"type": "http.response.start", "status": found.status, "headers": list(found.headers)})
                await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else found.body})
                return
        call = InstanceCall(scope)  # the request's context, made once: handlers, guard and watch share it
        if not self._in_flight.limit and self._limiter is None:
            await self._answer(call, send, handler, receive, None)
            return
        key = self._caller_key(call)
        if not self._in_flight.enter(key):
            await self._answer(call, send, _busy(self._in_flight.limit), receive, None)
            return
        try:
            await self._answer(call, send, handler, receive, key)
        finally:  # every way out (an error, a cancelled watch, a client gone) gives the slot back
            self._in_flight.leave(key)

    def remembered(self, client: Any, path: str, method: str, headers: list[tuple[bytes, bytes]]) -> Remembered | None:
        """A repeated fixed read answered whole from the memo (``imds.web.memo``), or None: ``serve`` it.

        The bookkeeping of ``serve`` is done here for it (counters, tally, read log); a caller
        at its in-flight or rate limit gets None, and ``serve`` answers the 429. For a request
        with no query string and an instance route that is not ``_not_here`` or ``_loading``.
        """
        memo = self._memo
        read = memo.key(path, headers) if memo is not None and method in READ_METHODS else None
        if read is None or memo is None:
            return None
        started = time.perf_counter()
        host = client[0] if client else None
        found = memo.recall(host, *read)
        return found if found is not None and self._counted(memo, found, host, path, started) else None

    def again(self, client: Any, path: str, found: Remembered) -> bool:
        """The very read ``remembered`` answered with ``found``, asked again: whether ``found`` still answers it.

        For a server that recognises a request by its bytes: the memo must still hold
        ``found`` (or what it was made from) for this caller and path (else the caller, the
        instance or its rendering moved), and its gate admit the read's token now; the
        bookkeeping is done as for ``remembered``. An answer made anew each time
        (``Remembered.renew``: a fresh seed; a gate's headers: the token's TTL) is made anew by
        ``ReadMemo.again`` (losing the server's encoding of the old one, ``wire``, if it changed).
        """
        started = time.perf_counter()
        host = client[0] if client else None
        memo = self._memo
        return memo is not None and memo.again(host, found) and self._counted(memo, found, host, path, started)

    def _counted(self, memo: ReadMemo, found: Remembered, host: str | None, path: str, started: float) -> bool:
        """``serve``'s bookkeeping for a remembered answer; False (nothing counted) when a limit refuses it."""
        if self._limiter is not None or self._in_flight.limit:
            key = self._key_of(host, parse_host(host) if self._behind_proxies and host else None)
            if self._in_flight.limit and self._in_flight.held(key) >= self._in_flight.limit:
                return False
            if self._limiter is not None and self._limiter.retry_after(key):
                return False
        memo.replay(found)
        self._tally.add(found.status, time.perf_counter() - started)
        if self._log_reads:
            _log.info("instance.read", path=path, peer=host, status=found.status)
        return True

    def prepare(self, scope: Scope) -> bool | None:
        """Make and keep the answer to the read ``scope`` asks, as its first read would, before it is asked.

        For ``imds.web.answers``: the read's handler runs as ``_answer`` runs it, without
        limits, tally, read log or hollow's counters (the kept answer counts them when a
        guest's read recalls it). Kept if it is a fixed 200 (``ReadMemo.keep``); False when it
        would wait (a signature being made: asked again later); None when not kept otherwise.
        """
        memo = self._memo
        handler = self.route(scope)
        read = _keepable(scope, memo) if memo is not None else None
        if memo is None or read is None or handler is None or handler in (_not_here, _loading):
            return None
        call = InstanceCall(scope)
        before = memo.counted()
        try:
            waiting = cast("Coroutine[Any, Any, Reply]", handler(call))
            try:
                waiting.send(None)
            except StopIteration as done:
                reply = done.value
            else:
                waiting.close()  # it would wait: its first read makes it, or this again later
                return False
            status, headers = reply_head(call, reply)
            if not reply.fixed or status != 200:
                return None
            memo.keep(call, read, headers, reply, before)
            return True
        finally:
            memo.restore(before)

    async def _answer(
        self, call: InstanceCall, send: Send, handler: Handler, receive: Receive, key: str | None
    ) -> None:
        started = time.perf_counter()
        scope = call.scope
        memo = self._memo
        kept_as = _keepable(scope, memo) if memo is not None else None  # the memo's key (``key`` is the limits')
        before = memo.counted() if memo is not None and kept_as is not None else None
        try:
            reply = self._limited(call, key) if key is not None else None  # no key: neither limit is on
            if reply is None:
                reply = await handler(call)
            if isinstance(reply, Pending) and reply.complete is not None:
                # A loop turn first: the completion reads a body, fetches or streams (anyio, httpx), which
                # needs a task; imds's own front runs requests eagerly, outside one, up to their first wait.
                await asyncio.sleep(0)
                reply = await reply.complete(receive)  # a write that needs the body (OpenStack password)
                if isinstance(reply, Streamed):  # checked only here: other replies pay nothing for it
                    await self._stream(scope, send, reply, started)
                    return
            elif scope["query_string"]:  # change watch: parsed only when there is a query
                reply = await self._watch(call, handler, reply, receive)
        except Exception:  # noqa: BLE001 - an instance must get an answer, never a dropped connection
            _log.exception("instance.error", path=scope["path"])
            reply = _own(call, _INTERNAL)
        status, headers = reply_head(call, reply)
        if before is not None and reply.fixed and status == 200 and memo is not None and kept_as is not None:
            memo.keep(call, kept_as, headers, reply, before)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" or status == 304
                    else reply.body})
        self._tally.add(status, time.perf_counter() - started)
        if self._log_reads:
            client = scope.get("client")
            _log.info("instance.read", path=scope["path"], peer=client[0] if client else None, status=status)

    async def _stream(self, scope: Scope, send: Send, reply: Streamed, started: float) -> None:
        """Send a streamed reply chunk by chunk; a failure after the headers aborts the connection (re-raised)."""
        chunks = reply.chunks
        assert chunks is not None  # noqa: S101 - a Streamed reply always carries its chunks
        headers = [*reply.headers, (b"content-type", reply.content_type)]
        if reply.length is not None:
            headers.append((b"content-length", str(reply.length).encode()))
        try:
            await send({"type": "http.response.start", "status": reply.status, "headers": headers})
            if scope["method"] != "HEAD":
                async for chunk in chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        except Exception as exc:
            _log.warning("instance.stream_cut", path=scope["path"], reason=str(exc)[:200])
            self._tally.add(reply.status, time.perf_counter() - started)
            # Past the headers no error answer is possible: the server must abort the connection, so the
            # client sees a cut response, never a short whole one (not the 500 of ``_answer``'s handler).
            raise _StreamAborted(str(exc)[:200]) from exc
        finally:
            await chunks.aclose()
            if reply.close is not None:
                await reply.close()
        self._tally.add(reply.status, time.perf_counter() - started)

    def _caller_key(self, call: InstanceCall) -> str:
        """The caller's address: the socket peer, or the forwarded caller when the peer is a trusted proxy."""
        client = call.scope.get("client")
        address = None
        if self._behind_proxies:
            try:
                address = self._locator.address(call)
            except ImdsError:  # a bad X-Forwarded-For: the handler answers it (400); count it against the peer
                address = None
        return self._key_of(client[0] if client else None, address)

    @staticmethod
    def _key_of(peer: str | None, address: Address | None) -> str:
        """The key of the limits: the caller's address found behind trusted proxies, else the socket peer."""
        return str(address) if address is not None else peer or "-"

    def _limited(self, call: InstanceCall, key: str) -> Reply | None:
        """A 429 with Retry-After when the caller's address has used up its rate, else None."""
        if self._limiter is None:
            return None
        wait = self._limiter.retry_after(key)
        return _own(call, error_reply(RateLimited(wait))) if wait else None

    async def _watch(self, call: InstanceCall, handler: Handler, reply: Reply, receive: Receive) -> Reply:
        """Hold the read while ``?wait_for_change=true`` asks for it (see ``imds.web.watch``)."""
        try:
            watch = parse_watch(call.scope["query_string"], self._watch_max)
        except ImdsError as exc:
            call.unversioned()
            return error_reply(exc)
        if watch is None or call.version is None:
            return reply
        waiting = self.services.metrics.watch_waiting
        waiting.inc()
        try:
            return await hold(call, reply, watch, lambda: handler(call), receive)
        finally:
            waiting.dec()

    async def _measured(self, scope: Scope, receive: Receive, send: Send, app: ASGIApp) -> None:
        started = time.perf_counter()
        group = self._groups.of(scope["path"])
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
