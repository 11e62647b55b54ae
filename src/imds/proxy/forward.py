"""The proxy's ASGI app: identify the VM by its socket peer, sign, forward, stream back.

Raw ASGI (no framework) on the hot path. For every request:

- the socket peer (never a header) goes to the ``Identifier``; unknown → 404 with a body,
  without contacting upstream;
- every copy the VM sent of ``X-Instance-ID``, ``X-Instance-ID-Signature``,
  ``X-Instance-ID-Timestamp``, ``X-Tenant-ID``, ``X-Instance-Host``
  and of every forwarding header (``imds.services.identity.tokens.FORWARDING_HEADERS``,
  any ``X-Forwarded-*``) is dropped, with the hop-by-hop headers, and the proxy's own are
  added (``X-Forwarded-For`` is the peer alone);
- an IMDSv2 token PUT (any path serve takes for the token path) that carried a forwarding
  header from the VM is refused here with serve's own answer (403, ``403 - Forbidden``),
  as AWS refuses it: the VM's headers are about to be dropped, so ``imds serve`` could no
  longer tell (the rule is in ``imds.services.identity.tokens``);
- the request (and its body, read whole up to ``max_body_bytes``) goes over a keep-alive
  pool (``imds.proxy.upstream``); status, headers (minus hop-by-hop, so ``ETag`` and a
  VM's ``If-None-Match`` pass) and body stream back;
- ``--timeout`` is one deadline for the whole exchange with the upstream: connect, the
  request, the answer's headers and streaming its body back (``asyncio.timeout`` around
  all of it), so an upstream trickling one byte a second holds a VM no longer than that.
  A change watch (``?wait_for_change=true``, see ``watch_wait``) gets its ``timeout_sec``
  (at most ``--watch-max-timeout``, the default when absent, as serve reads it) on top, so
  a legitimate long poll is never cut short;
- an upstream that cannot be reached (or not connected to within ``--connect-timeout``)
  → 503; connected but no answer within the deadline → 504, as haproxy answers both
  (cloud-init and botocore retry either); each with a JSON body. A deadline that passes
  once the headers are out cuts the connection: the VM sees a short body, never a
  truncated document taken for whole.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from imds import log
from imds.proxy.identify import Identifier, Identity
from imds.proxy.upstream import UpstreamFailed, UpstreamPool
from imds.services.admission.ratelimit import InFlight
from imds.services.catalog.addresses import parse_host
from imds.services.identity.tokens import FORWARDING_HEADERS, FORWARDING_PREFIX, forwarding, is_token_path
from imds.signing import (
    HOST_HEADER,
    INSTANCE_ID_HEADER,
    SIGNATURE_HEADER,
    TENANT_HEADER,
    TIMESTAMP_HEADER,
    SigningKey,
)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_log = log.get("proxy")
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"proxy-connection",
     b"te", b"trailer", b"transfer-encoding", b"upgrade"}
)
# What only the proxy may say about who is calling: every client-sent copy is dropped
# (and so is any other ``X-Forwarded-*``).
IDENTITY_HEADERS = frozenset(
    {INSTANCE_ID_HEADER.encode(), SIGNATURE_HEADER.encode(), TIMESTAMP_HEADER.encode(), TENANT_HEADER.encode(),
     HOST_HEADER.encode(), *(name.encode() for name in FORWARDING_HEADERS)}
)
_DROPPED = HOP_BY_HOP | IDENTITY_HEADERS | {b"content-length", b"host", b"expect"}
_FORWARDED_PREFIX = FORWARDING_PREFIX.encode()
# imds serve's answer to a token PUT through a proxy (Refused, as imds.web.errors maps it).
TOKEN_REFUSED = (403, b"403 - Forbidden", b"text/plain; charset=utf-8")
JSON = b"application/json"


@dataclass(frozen=True)
class ForwardPolicy:
    """Where to and how long: the upstream base URL and the per-request limits."""

    upstream: str
    timeout: float = 5.0
    connect_timeout: float = 2.0
    max_connections: int = 64
    max_body_bytes: int = 64 * 1024
    max_requests_per_source: int = 32
    watch_max_timeout: int = 300


def watch_wait(query: bytes, maximum: int) -> int:
    """Seconds a ``?wait_for_change=true`` read may be held upstream on top of ``--timeout``; 0 for any other.

    Serve's reading (``imds.web.watch.parse_watch``): the last ``wait_for_change`` decides,
    ``timeout_sec`` defaults to the maximum; a value serve would refuse (400 at once) gets
    the maximum here too, never more.
    """
    if b"wait_for_change" not in query:  # most reads: no parsing at all
        return 0
    params = parse_qs(query.decode("latin-1"), keep_blank_values=True)
    flag = params.get("wait_for_change")
    if not flag or flag[-1].lower() not in {"true", "1"}:
        return 0
    asked = params.get("timeout_sec", [""])[-1]
    return min(int(asked), maximum) if asked.isdigit() and int(asked) > 0 else maximum


class BodyTooLarge(Exception):
    """The VM sent a body over ``max_body_bytes``."""


def _reply(status: int, message: str) -> tuple[int, bytes]:
    return status, json.dumps({"message": message}).encode()


class ProxyApp:
    """``imds proxy``'s ASGI app; ``lifespan`` starts the identifier and the upstream pool.

    ``key`` signs each request (this host's own key, or the shared secret); ``tls`` is the
    context for an https:// upstream (``imds.proxy.upstream.tls_context``).
    """

    def __init__(
        self, identifier: Identifier, key: SigningKey, policy: ForwardPolicy, *, tls: ssl.SSLContext | None = None
    ) -> None:
        self.identifier = identifier
        self.policy = policy
        self._key = key
        self._host = key.host.encode() if key.host else None
        self._upstream = policy.upstream
        self._in_flight = InFlight(policy.max_requests_per_source)
        self._pool = UpstreamPool(
            policy.upstream, size=policy.max_connections, connect_timeout=policy.connect_timeout, tls=tls
        )

    async def start(self) -> None:
        """Start the identifier (the pool connects on demand)."""
        await self.identifier.start()

    async def stop(self) -> None:
        """Close the idle upstream connections and stop the identifier."""
        await self._pool.aclose()
        await self.identifier.stop()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        client = scope.get("client")
        peer = parse_host(client[0]) if client else None
        identity = await self.identifier.identify(peer) if peer is not None else None
        if identity is None:
            _log.debug("proxy.unknown_peer", peer=str(peer) if peer else None, path=scope["path"])
            await _answer(send, *_reply(404, f"no instance is associated with {peer or 'an unidentified caller'}"))
            return
        if scope["method"] == "PUT" and is_token_path(scope["path"]) and forwarding(scope["headers"]):
            await _answer(send, *TOKEN_REFUSED)
            return
        source = str(peer)
        if not self._in_flight.enter(source):
            limit = self._in_flight.limit
            await _answer(send, *_reply(429, f"too many requests in flight from {source} (--max-requests-per-source "
                                             f"{limit}): try again in 1 s"), retry_after=True)
            return
        try:
            try:
                body = await self._body(scope, receive)
            except BodyTooLarge:
                await _answer(send, *_reply(413, f"request body is larger than {self.policy.max_body_bytes} bytes"))
                return
            await self._forward(scope, send, identity, source, body)
        finally:  # every way out (answered, failed, client gone, cancelled) gives the slot back
            self._in_flight.leave(source)

    async def _forward(self, scope: Scope, send: Send, identity: Identity, peer: str, body: bytes | None) -> None:
        target = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string") or b""
        if query:
            target += b"?" + query
        headers = self._headers(scope, identity, peer)
        deadline = self.policy.timeout + watch_wait(query, self.policy.watch_max_timeout)
        answered = False
        try:
            async with asyncio.timeout(deadline):  # connect, request, headers and the whole body
                response = await self._pool.request(scope["method"], target, headers, body)
                try:
                    answer = [(k, v) for k, v in response.headers if k.lower() not in HOP_BY_HOP]
                    await send({"type": "http.response.start", "status": response.status, "headers": answer})
                    answered = True
                    async for chunk in response.chunks():
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    await send({"type": "http.response.body", "body": b""})
                finally:
                    response.close()
        except TimeoutError:
            _log.warning("proxy.upstream_timeout", upstream=self._upstream, seconds=deadline, answered=answered)
            if not answered:  # once the headers are out, all that is left is to cut the answer short
                await _answer(send, *_reply(504, f"metadata service did not answer within {deadline:g} s"))
        except UpstreamFailed as exc:
            _log.warning("proxy.upstream_unavailable" if not answered else "proxy.upstream_broke",
                         upstream=self._upstream, error=str(exc))
            if not answered:
                await _answer(send, *_reply(503, "metadata service unavailable"))

    def _headers(self, scope: Scope, identity: Identity, peer: str) -> list[tuple[bytes, bytes]]:
        headers = [(k, v) for k, v in scope["headers"] if k not in _DROPPED and not k.startswith(_FORWARDED_PREFIX)]
        instance_id, tenant = identity.instance_id, identity.tenant_id or None
        now = int(time.time())  # signed per request: a captured header is only good within serve's window
        headers += [
            (INSTANCE_ID_HEADER.encode(), instance_id.encode()),
            (TIMESTAMP_HEADER.encode(), str(now).encode()),
            (SIGNATURE_HEADER.encode(), self._key.sign(instance_id, now, tenant).encode()),
            (b"x-forwarded-for", peer.encode()),
        ]
        if identity.tenant_id:
            headers.append((TENANT_HEADER.encode(), identity.tenant_id.encode()))
        if self._host is not None:
            headers.append((HOST_HEADER.encode(), self._host))
        return headers

    async def _body(self, scope: Scope, receive: Receive) -> bytes | None:
        if not _has(scope, b"content-length") and not _has(scope, b"transfer-encoding"):
            return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.policy.max_body_bytes:
                raise BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as exc:  # noqa: BLE001 - reported to the server, which exits
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return


def _has(scope: Scope, name: bytes) -> bool:
    return any(key == name for key, _ in scope["headers"])


async def _answer(
    send: Send, status: int, body: bytes, content_type: bytes = JSON, *, retry_after: bool = False
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if retry_after:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
