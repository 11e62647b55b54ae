"""Listener limits the HTTP server does not enforce itself, as a thin ASGI wrapper.

Whatever server runs the app (granian or uvicorn), every request passes here first:

- more header lines than ``--max-headers``: 431 (granian refuses above 100 itself);
- ambiguous framing (``Content-Length`` twice, or with ``Transfer-Encoding``): 400, the
  classic request-smuggling shapes, refused rather than guessed at;
- a declared ``Content-Length`` over ``--max-body-bytes``: 413 before any body is read;
- a body part that takes longer than ``--body-timeout`` to arrive: 408 (or the
  connection is dropped if the answer had started), so a chunk declared
  ``FFFFFFFFFFFFFFFF`` or a trickled body cannot hold a connection forever.

Each refusal closes the connection (and, on GCE's paths, says ``Metadata-Flavor: Google``, as
every answer there does). Requests without a body (every instance read) pay a scan of their
header list and nothing else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from imds.config import Settings
from imds.errors import HeadersTooLarge, ImdsError, InvalidInput, PayloadTooLarge, RequestTimeout
from imds.web.errors import JSON, error_parts
from imds.web.routes import on_gce_path

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]


class _BodyTimedOut(BaseException):
    """Raised through the app when a body part is late; BaseException so no handler swallows it."""


class Bounded:
    """Wraps an ASGI app with the request limits above."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.max_headers = settings.http.max_headers
        self.max_body = settings.limits.max_body_bytes
        self.body_timeout = settings.http.body_timeout

    def __getattr__(self, name: str) -> Any:
        """Expose the wrapped app's attributes (``services`` for tests and tools)."""
        return getattr(self.app, name)

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope["headers"]
        if len(headers) > self.max_headers:
            await _refuse(scope, send, HeadersTooLarge(self.max_headers))
            return
        lengths: list[bytes] = []
        chunked = False
        for name, value in headers:
            if name == b"content-length":
                lengths.append(value)
            elif name == b"transfer-encoding":
                chunked = True
        if not lengths and not chunked:
            await self.app(scope, receive, send)
            return
        problem = self._framing_problem(lengths, chunked=chunked)
        if problem is not None:
            await _refuse(scope, send, problem)
            return
        await self._with_body(scope, receive, send)

    def untouched(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """Whether a request with ``headers`` passes this wrapper as it is: no refusal, no body to time.

        True for at most ``--max-headers`` lines with no body framing (or one
        ``Content-Length: 0``): what imds's own front (``imds.cli.front``) may answer
        without calling the wrapper, since it would only hand the request on.
        """
        if len(headers) > self.max_headers:
            return False
        length = False
        for name, value in headers:
            if name == b"content-length":
                if length or value != b"0":
                    return False
                length = True
            elif name == b"transfer-encoding":
                return False
        return True

    def _framing_problem(self, lengths: list[bytes], *, chunked: bool) -> ImdsError | None:
        if len(lengths) > 1 or (lengths and chunked):
            return InvalidInput.one("Content-Length", "ambiguous framing (repeated, or with Transfer-Encoding)")
        if lengths and not lengths[0].isdigit():
            return InvalidInput.one("Content-Length", "must be a number")
        if lengths and int(lengths[0]) > self.max_body:
            return PayloadTooLarge(self.max_body)
        return None

    async def _with_body(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        started = False

        async def timed_receive() -> Message:
            try:
                return await asyncio.wait_for(receive(), self.body_timeout)
            except TimeoutError:
                raise _BodyTimedOut from None

        async def noting_send(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, timed_receive, noting_send)
        except _BodyTimedOut:
            if not started:
                await _refuse(scope, send, RequestTimeout(self.body_timeout))


async def _refuse(scope: MutableMapping[str, Any], send: Send, exc: ImdsError) -> None:
    """Answer with the error's status and JSON body, closing the connection."""
    status, body, extra = error_parts(exc)
    if on_gce_path(scope["path"]):
        extra.append((b"metadata-flavor", b"Google"))
    headers = [
        *extra,
        (b"content-type", JSON.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
