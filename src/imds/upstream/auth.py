"""Credentials for upstream calls: none, a static bearer token, or OAuth2 client credentials.

Client credentials: the token endpoint comes from the issuer's OIDC discovery document
(``imds.upstream.oidc.Discovery``, shared with the admin token verifier);
the access token is cached until shortly before it expires and fetched anew when the
upstream answers 401 (once per call).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from imds.errors import UpstreamError
from imds.upstream.oidc import Discovery

_EARLY = 30.0  # renew this many seconds before the token's own expiry


class UpstreamAuth(Protocol):
    """Adds credentials to upstream requests."""

    async def headers(self) -> dict[str, str]:
        """Authorization headers for the next call."""
        ...

    def invalidate(self) -> None:
        """Forget cached credentials (the upstream said 401)."""
        ...


class NoCredentials:
    """Calls go out without credentials."""

    async def headers(self) -> dict[str, str]:
        return {}

    def invalidate(self) -> None:
        return None


class StaticBearer:
    """A fixed bearer token."""

    def __init__(self, token: str) -> None:
        self._token = token

    async def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"}

    def invalidate(self) -> None:
        return None


@dataclass(frozen=True)
class ClientCredentials:
    """What an OAuth2 client-credentials grant needs."""

    issuer: str
    client_id: str
    client_secret: str
    scopes: tuple[str, ...] = ()
    audience: str | None = None

    def __repr__(self) -> str:
        return f"ClientCredentials(issuer={self.issuer!r}, client_id={self.client_id!r})"


class OAuth2ClientCredentials:
    """Access tokens from the issuer's token endpoint, cached until shortly before expiry."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        credentials: ClientCredentials,
        clock: Callable[[], float] = time.monotonic,
        discovery: Discovery | None = None,
    ) -> None:
        self._http = http
        self._discovery = discovery or Discovery(http)
        self._credentials = credentials
        self._clock = clock
        self._token: str | None = None
        self._expires = 0.0
        self._lock = asyncio.Lock()

    async def headers(self) -> dict[str, str]:
        async with self._lock:
            if self._token is None or self._clock() >= self._expires:
                await self._fetch()
            return {"Authorization": f"Bearer {self._token}"}

    def invalidate(self) -> None:
        self._token = None

    async def _fetch(self) -> None:
        url = await self._discovery.endpoint(self._credentials.issuer, "token_endpoint")
        form = {"grant_type": "client_credentials"}
        if self._credentials.scopes:
            form["scope"] = " ".join(self._credentials.scopes)
        if self._credentials.audience:
            form["audience"] = self._credentials.audience
        # RFC 6749 section 2.3.1: id and secret are form-encoded before HTTP Basic, so ":" or
        # "%" in a secret survives servers that decode them (as the RFC says they must).
        auth = (quote(self._credentials.client_id, safe=""), quote(self._credentials.client_secret, safe=""))
        body = await self._json("POST", url, data=form, auth=auth)
        token = body.get("access_token")
        if not isinstance(token, str) or not token:
            msg = f"token endpoint {url} answered without an access_token"
            raise UpstreamError(msg)
        lifetime = body.get("expires_in")
        seconds = float(lifetime) if isinstance(lifetime, int | float) and lifetime > 0 else 300.0
        self._token = token
        self._expires = self._clock() + max(seconds - _EARLY, seconds / 2)

    async def _json(self, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = await self._http.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            msg = f"cannot reach {url}: {type(exc).__name__}"
            raise UpstreamError(msg) from exc
        if response.status_code != 200:
            msg = f"{url} answered {response.status_code}"
            raise UpstreamError(msg)
        try:
            body = response.json()
        except ValueError as exc:
            msg = f"{url} answered something that is not JSON"
            raise UpstreamError(msg) from exc
        if not isinstance(body, dict):
            msg = f"{url} answered JSON that is not an object"
            raise UpstreamError(msg)
        return body
