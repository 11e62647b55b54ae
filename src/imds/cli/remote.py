"""A small client of the admin API for commands given ``--url`` (``imds get|list|delete|import|export``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import click
import httpx


class AdminClient:
    """The admin API at ``url`` with a bearer ``token``; failures become one-line ClickExceptions."""

    def __init__(self, url: str, token: str | None, *, timeout: float = 30.0) -> None:
        if not url.lower().startswith(("http://", "https://")):
            raise click.UsageError(f"--url {url!r} is not an http:// or https:// URL")
        if not token:
            raise click.UsageError("--url needs an admin token: --token, or IMDS_ADMIN_TOKEN in the environment")
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, trust_env=False)

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def get_json(self, path: str, *, missing_ok: bool = False) -> Any:
        """GET ``path`` as JSON; None for a 404 when ``missing_ok``."""
        response = self._send("GET", path)
        if missing_ok and response.status_code == 404:
            return None
        self._check(response)
        return response.json()

    def send_json(self, method: str, path: str, body: Any = None) -> Any:
        """``method`` ``path`` with a JSON body; the JSON answer."""
        response = self._send(method, path, json=body)
        self._check(response)
        return response.json()

    def lines(self, path: str) -> Iterator[Any]:
        """GET ``path`` as JSON lines, streamed."""
        try:
            with self._http.stream("GET", path) as response:
                if response.status_code >= 400:
                    response.read()
                    self._check(response)
                for line in response.iter_lines():
                    if line.strip():
                        yield json.loads(line)
        except httpx.HTTPError as exc:
            raise click.ClickException(f"{self.url}{path}: {exc}") from exc

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise click.ClickException(f"cannot reach {self.url}: {exc}") from exc

    def _check(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        try:
            body = response.json()
        except ValueError:
            body = {"message": response.text.strip()[:200]}
        message = body.get("message", "") if isinstance(body, dict) else str(body)
        problems = body.get("errors", []) if isinstance(body, dict) else []
        details = "; ".join(f"{p.get('field')}: {p.get('message')}" for p in problems if isinstance(p, dict))
        shown = f"{message} ({details})" if details else message
        request = response.request
        raise click.ClickException(f"{request.method} {request.url.path}: {response.status_code} {shown}")
