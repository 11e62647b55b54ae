"""The GCE flavor: ``/computeMetadata/v1/…`` as Compute Engine serves it, identity tokens and their key set.

Every request must carry ``Metadata-Flavor: Google`` (403 without) and no
``X-Forwarded-For`` (403; as on GCE, so a request relayed by an SSRF-able proxy is refused),
unless a trusted proxy signed the instance id and forwarded only the VM's own address (the
rule of ``imds.services.identity.proxied.may_mint_through``, as for IMDSv2 tokens). Every
answer, errors included, carries ``Metadata-Flavor: Google``. A directory answers its
listing (one entry per line, subdirectories with ``/``), ``?recursive=true`` its subtree
as JSON (camelCase keys, attributes verbatim), ``?alt=json|text`` the other shape. A 200
read carries the instance's ETag unquoted (GCE's form, safe to pass back in a URL as
``last_etag``); ``?wait_for_change=true`` holds the read until the instance changes (the
change watch of ``imds.web.watch``, ``timeout_sec`` bounded by ``--watch-max-timeout``).

``…/service-accounts/<default or email>/identity?audience=A[&format=full]`` answers a JWT
(``imds.services.identity.idtoken``); ``…/token`` answers 404: imds hands out no OAuth access
tokens. ``GET /`` with ``Metadata-Flavor: Google`` answers as GCE's root does (``GOOGLE_ROOT``,
for google-auth's ``ping``; the EC2 flavor, which owns ``/``, hands it out). ``/.well-known/jwks.json`` and
``/.well-known/openid-configuration`` publish the key set that verifies identity tokens.
"""

from __future__ import annotations

from http import HTTPStatus
from urllib.parse import parse_qs

from imds.errors import ImdsError, InvalidInput, NotFound, Refused
from imds.models import METADATA
from imds.services import Services
from imds.services.identity.proxied import may_mint_through
from imds.services.identity.tokens import forwarding
from imds.services.render.gce import IDENTITY, TOKEN, find, gce_in_context, identity_claims
from imds.services.render.gce import answer as render_answer
from imds.web.errors import status_for
from imds.web.replies import plain
from imds.web.routing import JSON, READ_METHODS, InstanceCall, Locator, Pending, Receive, Reply, header
from imds.web.watch import Watch, hold, parse_watch

FLAVOR = (b"metadata-flavor", b"Google")
_TEXT = b"application/text"
_XFF = b"x-forwarded-for"
_NO_ACCESS_TOKENS = ("imds hands out no OAuth access tokens: ask identity?audience=... for an identity token "
                     "(a JWT verified with /.well-known/jwks.json)")
_CACHED = (b"cache-control", b"public, max-age=300")


GOOGLE_ROOT = Reply(200, b"computeMetadata/\n", _TEXT, (FLAVOR,))  # GET / with Metadata-Flavor: Google


def google_flavored(call: InstanceCall) -> bool:
    """Whether the request carries ``Metadata-Flavor: Google`` (GCE's clients always send it)."""
    return header(call.scope, b"metadata-flavor") == "Google"


_Path = tuple[list[str], dict[str, list[str]]]  # the path's parts under v1, and the query


async def _as_is(reply: Reply) -> Reply:
    return reply


def _failed(exc: ImdsError) -> Reply:
    status = status_for(exc)
    return Reply(status, f"{status} - {HTTPStatus(status).phrase}: {exc.message}\n".encode(), _TEXT, (FLAVOR,))


class GceFlavor:
    """Serves GCE's metadata tree rendered from the caller's record, and identity tokens."""

    def __init__(self, services: Services, locator: Locator) -> None:
        self._services = services
        self._locator = locator
        self._watch_max = services.settings.channel.watch_max_timeout

    async def jwks(self, call: InstanceCall) -> Reply:
        """``/.well-known/jwks.json``: the keys that verify identity tokens (current and previous)."""
        return self._published(call, self._services.idtokens.jwks)

    async def discovery(self, call: InstanceCall) -> Reply:
        """``/.well-known/openid-configuration``: the issuer and where its key set is."""
        return self._published(call, self._services.idtokens.discovery)

    def _published(self, call: InstanceCall, data: bytes) -> Reply:
        if call.scope["method"] not in READ_METHODS:
            return plain(405)
        return Reply(200, data, JSON, (_CACHED,))

    async def handle(self, call: InstanceCall) -> Reply:
        """Any path under ``/computeMetadata``."""
        reply, held = await self._answer(call)
        if held is not None:
            return Pending(complete=lambda receive: self._held(call, reply, *held, receive))
        call.unversioned()  # the front's quoted ETag is not sent: ours is in the reply, unquoted
        if b"wait_for_change" in call.scope["query_string"]:
            # Answered as is: a Pending reply keeps the front's own watch (and its JSON errors) off GCE's paths.
            return Pending(complete=lambda _receive: _as_is(reply))
        return reply

    async def _answer(self, call: InstanceCall) -> tuple[Reply, tuple[Watch, _Path] | None]:
        """The first answer, and what to hold it on when it asks to wait for a change."""
        scope = call.scope
        try:
            self._admit(call)
            parts = [part for part in scope["path"].split("/")[2:] if part]
            if not parts:
                return Reply(200, b"v1/\n", _TEXT, (FLAVOR,)), None
            if parts[0] != "v1":
                raise NotFound(f"no metadata version {parts[0]!r} (this server has v1)")
            query = parse_qs(scope["query_string"].decode("latin-1")) if scope["query_string"] else {}
            watch = parse_watch(scope["query_string"], self._watch_max) if scope["query_string"] else None
            reply = await self._read(call, parts[1:], query)
        except ImdsError as exc:
            call.unversioned()
            return _failed(exc), None
        if watch is None or call.version is None:
            return reply, None
        return reply, (watch, (parts[1:], query))

    def _admit(self, call: InstanceCall) -> None:
        """GCE's request checks: the flavor header, and no proxy in between."""
        headers = call.scope["headers"]
        if not google_flavored(call):
            raise Refused("missing Metadata-Flavor: Google header")
        if forwarding(headers):
            forwarded = [v.decode("latin-1") for k, v in headers if k == _XFF]
            relayed = forwarding(h for h in headers if h[0] != _XFF)
            if relayed or not may_mint_through(self._locator.claim(call), forwarded):
                raise Refused("a request with X-Forwarded-For is refused")
        if call.scope["method"] not in READ_METHODS:
            raise InvalidInput.one("method", "the metadata server answers GET and HEAD")

    async def _read(self, call: InstanceCall, parts: list[str], query: dict[str, list[str]]) -> Reply:
        alt = query.get("alt", [None])[-1]
        if alt not in (None, "json", "text"):
            raise InvalidInput.one("alt", "must be json or text")
        recursive = query.get("recursive", ["false"])[-1].lower() == "true"
        entry = await self._locator.entry(call, METADATA, needs_record=True)
        node = find(entry.render_in_context("gce", gce_in_context), parts)
        if node is None:
            raise NotFound(f"no {'/'.join(parts)!r} under /computeMetadata/v1")
        if node is TOKEN:
            raise NotFound(_NO_ACCESS_TOKENS)
        if node is IDENTITY:
            audience = query.get("audience", [""])[-1]
            if not audience:
                raise InvalidInput.one("audience", "a non-empty audience parameter is required")
            full = query.get("format", ["standard"])[-1] == "full"
            token = self._services.idtokens.issue(identity_claims(entry.instance, audience, full=full))
            call.unversioned()  # a token is no instance document: no ETag, no watch
            self._locator.served(METADATA)
            return Reply(200, token.encode(), _TEXT, (FLAVOR,))
        body, content_type = render_answer(node, recursive=recursive, alt=alt, verbatim=parts[-1:] == ["attributes"])
        self._locator.served(METADATA)
        # Fixed: the read memo keeps it under the path and the Metadata-Flavor value (imds.web.memo.memo_key).
        return Reply(200, body, content_type, (FLAVOR, (b"etag", entry.etag.strip(b'"'))), fixed=True)

    async def _held(
        self, call: InstanceCall, first: Reply, watch: Watch, path: _Path, receive: Receive,
    ) -> Reply:
        """Hold the read until the instance's ETag differs from ``last_etag`` (``imds.web.watch.hold``)."""

        async def again() -> Reply:
            try:
                return await self._read(call, *path)
            except ImdsError as exc:
                call.unversioned()
                return _failed(exc)

        waiting = self._services.metrics.watch_waiting
        waiting.inc()
        try:
            return await hold(call, first, watch, again, receive)
        finally:
            waiting.dec()
            call.unversioned()
