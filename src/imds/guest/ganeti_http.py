"""The metadata service's ``/ganeti/latest`` paths, as ``ganeti install`` uses them (urllib only).

Reads are bounded (``MAX_DOCUMENT`` for parameters, environment and archives) except the
image, which is handed over as an open response to be streamed. Progress goes to
``POST /ganeti/latest/write`` as ``{"state", "code"?, "message"?}``; a 429 (the service's
per-instance event rate) is waited out as its ``Retry-After`` says, up to
``EVENT_PATIENCE`` seconds, except for intermediate progress events, which are dropped
rather than slow the copy down. Proxy variables are ignored, as for ``udev``: link-local
metadata is always fetched directly.

Usage::

    service = Service("http://169.254.169.254", timeout=30, sleep=time.sleep)
    parameters = service.json("os/parameters.json")
    service.event("started")
    with service.open("os/image") as response: ...
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import IO, cast

from imds.guest.errors import NotServed, ServiceError

PREFIX = "ganeti/latest"
MAX_DOCUMENT = 256 * 1024 * 1024  # an OS definition or package archive, read into a temporary file
EVENT_PATIENCE = 60.0  # seconds an event may wait for the service's rate limit
_MAX_RETRY_AFTER = 10.0
_MESSAGE_CHARS = 1000  # the service's events are at most 4 KiB by default


class Service:
    """One metadata service base URL; every method raises ServiceError with a one-line reason."""

    def __init__(self, base: str, *, timeout: float, sleep: Callable[[float], None] = time.sleep) -> None:
        if urllib.parse.urlsplit(base).scheme not in ("http", "https"):
            msg = f"metadata URL {base!r}: only http:// and https:// are supported"
            raise ServiceError(msg)
        self.base = base.rstrip("/")
        self.timeout = timeout
        self._sleep = sleep
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def url(self, path: str) -> str:
        """``{base}/ganeti/latest/{path}``."""
        return f"{self.base}/{PREFIX}/{path}"

    def open(self, path: str) -> http.client.HTTPResponse:
        """The response to ``GET path``, unread; NotServed for a 404, ServiceError for any other failure."""
        url = self.url(path)
        try:
            return cast("http.client.HTTPResponse", self._opener.open(url, timeout=self.timeout))
        except urllib.error.HTTPError as exc:
            exc.close()
            kind = NotServed if exc.code == 404 else ServiceError
            raise kind(f"{url}: HTTP {exc.code} {exc.reason}") from exc
        except urllib.error.URLError as exc:
            raise ServiceError(f"{url}: {exc.reason}") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise ServiceError(f"{url}: {exc or type(exc).__name__}") from exc

    def read(self, path: str, limit: int = MAX_DOCUMENT) -> bytes:
        """The whole body of ``GET path`` (at most ``limit`` bytes)."""
        with self.open(path) as response:
            data = read_body(response, self.url(path), limit)
        if len(data) > limit:
            msg = f"{self.url(path)}: larger than {limit} bytes"
            raise ServiceError(msg)
        return data

    def json(self, path: str) -> object:
        """``GET path`` parsed as JSON."""
        data = self.read(path, 16 * 1024 * 1024)
        try:
            return json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ServiceError(f"{self.url(path)}: not valid JSON ({exc})") from exc

    def event(self, state: str, *, code: int | None = None, message: str | None = None,
              progress: bool = False) -> bool:
        """Post one event; False when a progress event was dropped because of the rate limit."""
        body: dict[str, object] = {"state": state}
        if code is not None:
            body["code"] = code
        if message is not None:
            body["message"] = message[:_MESSAGE_CHARS]
        data = json.dumps(body).encode()
        deadline = time.monotonic() + EVENT_PATIENCE
        url = self.url("write")
        while True:
            request = urllib.request.Request(  # noqa: S310 - the scheme was checked in __init__
                url, data=data, method="POST", headers={"Content-Type": "application/json"}
            )
            try:
                with self._opener.open(request, timeout=self.timeout) as response:
                    response.read()
            except urllib.error.HTTPError as exc:
                exc.close()
                wait = _retry_after(exc)
                if wait is None or progress or time.monotonic() + wait > deadline:
                    if progress and wait is not None:
                        return False
                    raise ServiceError(f"POST {url} ({state}): HTTP {exc.code} {exc.reason}") from exc
                self._sleep(wait)
            except urllib.error.URLError as exc:
                raise ServiceError(f"POST {url} ({state}): {exc.reason}") from exc
            except (OSError, http.client.HTTPException) as exc:
                raise ServiceError(f"POST {url} ({state}): {exc or type(exc).__name__}") from exc
            else:
                return True


def read_body(response: IO[bytes], url: str, limit: int) -> bytes:
    """Up to ``limit + 1`` bytes of a response; a cut-off body is a ServiceError."""
    try:
        return response.read(limit + 1)
    except http.client.IncompleteRead as exc:
        msg = f"{url}: the body ended early ({len(exc.partial)} bytes read, more expected)"
        raise ServiceError(msg) from exc
    except (OSError, http.client.HTTPException) as exc:
        raise ServiceError(f"{url}: {exc or type(exc).__name__}") from exc


def _retry_after(error: urllib.error.HTTPError) -> float | None:
    """Seconds to wait before retrying a 429, or None when the error is not one to wait out."""
    if error.code != 429:
        return None
    try:
        seconds = float(error.headers.get("Retry-After", "1"))
    except ValueError:
        seconds = 1.0
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER)
