"""Fetching an OIDC issuer's documents: its discovery document (once per issuer) and its JWKS.

``Discovery`` is shared by everything that talks to issuers (the admin token verifier,
the upstream client-credentials grant), so an issuer's discovery document is fetched
once however many parts need an endpoint from it. Failures are ``UpstreamError`` naming
the URL; a failed fetch is not cached (the next call tries again).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from imds import log
from imds.errors import UpstreamError

_log = log.get("oidc")

MAX_DOCUMENT_BYTES = 1024 * 1024
DISCOVERY_PATH = "/.well-known/openid-configuration"


def discovery_url(issuer: str) -> str:
    """Where ``issuer`` publishes its discovery document (a trailing slash is not significant)."""
    return issuer.rstrip("/") + DISCOVERY_PATH


async def get_json(http: httpx.AsyncClient, url: str, what: str) -> dict[str, Any]:
    """GET ``url`` and return its JSON object; ``what`` names the document in errors."""
    try:
        response = await http.get(url, headers={"Accept": "application/json"}, follow_redirects=True)
    except httpx.HTTPError as exc:
        reason = str(exc) or type(exc).__name__
        _log.warning("oidc.fetch_failed", url=url, error=reason)
        raise UpstreamError(f"cannot fetch the {what} from {url}: {reason}") from exc
    if response.status_code != 200:
        _log.warning("oidc.fetch_failed", url=url, status=response.status_code)
        raise UpstreamError(f"cannot fetch the {what} from {url}: HTTP {response.status_code}")
    if len(response.content) > MAX_DOCUMENT_BYTES:
        raise UpstreamError(f"the {what} at {url} is larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        document: Any = json.loads(response.content)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UpstreamError(f"the {what} at {url} is not JSON") from exc
    if not isinstance(document, dict):
        raise UpstreamError(f"the {what} at {url} is not a JSON object")
    return document


class Discovery:
    """Issuers' discovery documents, each fetched once and kept (concurrent first calls share one fetch)."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        self._documents: dict[str, dict[str, Any]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def endpoint(self, issuer: str, name: str) -> str:
        """The http(s) URL that ``issuer``'s discovery document gives for ``name`` (``jwks_uri``, …)."""
        url = discovery_url(issuer)
        document = self._documents.get(url)
        if document is None:
            async with self._locks.setdefault(url, asyncio.Lock()):
                document = self._documents.get(url)
                if document is None:
                    document = self._documents[url] = await get_json(self.http, url, "OIDC discovery document")
        value = document.get(name)
        if not isinstance(value, str) or not value.startswith(("https://", "http://")):
            raise UpstreamError(f"OIDC discovery document at {url} is malformed: no http(s) {name}")
        return value


class IssuerKeys:
    """An issuer's JWKS document: from ``jwks_url`` when given, else from its discovery document."""

    def __init__(self, discovery: Discovery, issuer: str, jwks_url: str | None = None) -> None:
        self._issuer = issuer
        self._jwks_url = jwks_url
        self._discovery = discovery

    async def fetch(self) -> tuple[str, dict[str, Any]]:
        """The JWKS URL and the document found there."""
        url = self._jwks_url or await self._discovery.endpoint(self._issuer, "jwks_uri")
        return url, await get_json(self._discovery.http, url, "JWKS")
