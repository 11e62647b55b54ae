"""``UpstreamClient``: hollow's lookup contract.

``GET {base}/device-metadata/{id}``, ``{base}/device-metadata?ip_address={ip}`` and the
same for ``device-userdata``. 200 → the JSON body (``{"id", "ipAddresses", "metadata" |
"userdata"}``, parsed by ``imds.services.records.wire``); 404 → None; anything else, a timeout or a
transport failure → ``UpstreamError``. A base URL with or without a trailing slash works.
"""

from __future__ import annotations

from typing import Any

import httpx

from imds import __version__
from imds.errors import UpstreamError, UpstreamUnavailable
from imds.upstream.auth import NoCredentials, UpstreamAuth

USER_AGENT = f"imds/{__version__}"


class UpstreamClient:
    """Fetches records from the source of truth over an injected ``httpx.AsyncClient``."""

    def __init__(
        self, http: httpx.AsyncClient, base_url: str, *, auth: UpstreamAuth | None = None, timeout: float = 2.0
    ) -> None:
        self._http = http
        self._base = base_url.rstrip("/")
        self._auth = auth or NoCredentials()
        self._timeout = timeout

    async def by_id(self, kind: str, instance_id: str) -> Any | None:
        """The upstream's record of ``kind`` for this instance id, or None (404)."""
        return await self._get(f"{self._base}/device-{kind}/{instance_id}", params=None)

    async def by_ip(self, kind: str, address: str) -> Any | None:
        """The upstream's record of ``kind`` for the instance holding ``address``, or None (404)."""
        return await self._get(f"{self._base}/device-{kind}", params={"ip_address": address})

    async def _get(self, url: str, params: dict[str, str] | None) -> Any | None:
        response = await self._send(url, params)
        if response.status_code == 401:
            self._auth.invalidate()
            response = await self._send(url, params)
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            kind = UpstreamUnavailable if response.status_code >= 500 else UpstreamError
            msg = f"upstream answered {response.status_code} for {response.request.url.path}"
            raise kind(msg)
        try:
            return response.json()
        except ValueError as exc:
            msg = f"upstream answered non-JSON for {response.request.url.path}"
            raise UpstreamError(msg) from exc

    async def _send(self, url: str, params: dict[str, str] | None) -> httpx.Response:
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **(await self._auth.headers())}
        try:
            return await self._http.get(url, params=params, headers=headers, timeout=self._timeout)
        except httpx.TimeoutException as exc:
            msg = f"upstream timed out after {self._timeout:g} s"
            raise UpstreamUnavailable(msg) from exc
        except httpx.HTTPError as exc:
            msg = f"upstream unreachable: {type(exc).__name__}"
            raise UpstreamUnavailable(msg) from exc
