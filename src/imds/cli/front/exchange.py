"""The ``send`` and ``receive`` of an instance request answered in place: ASGI messages straight to bytes.

``InstanceFront.serve`` answers with the same two messages it sends any ASGI server
(``http.response.start``, then ``http.response.body``); here they become one
``transport.write`` of the status line, the headers and the body, with no task, queue or
event in between. One ``Exchange`` per connection is reset for each request it answers.

What it adds to the app's headers: ``date`` (refreshed every tick, as uvicorn does), and
``connection: close`` when the connection ends after this answer (``connection:
keep-alive`` for an HTTP/1.0 client that asked to keep it). A reply without
``content-length`` (a streamed one of unknown length) is sent chunked to HTTP/1.1 clients
and delimited by closing the connection for HTTP/1.0 ones. Header values are checked for
line breaks (a response must never be split), as uvicorn checks them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

Message = MutableMapping[str, Any]
Headers = Iterable[tuple[bytes, bytes]]
_REQUEST: Message = {"type": "http.request", "body": b"", "more_body": False}
_NO_BODY = frozenset({204, 304})
SMALL = 16384  # a head and a body up to this size go out as one joined write


class DateLine:
    """The ``date`` header line every answer carries, rewritten once a second by the server's tick."""

    __slots__ = ("line",)

    def __init__(self) -> None:
        self.line = b""


class Exchange:
    """One instance request's ASGI ``send``/``receive`` on a connection (reset per request)."""

    __slots__ = ("_chunked", "_date", "_flow", "_head_only", "_http10", "_left", "_status", "_transport", "_waiters",
                 "complete", "given", "headers", "keep_alive", "lost", "on_close")

    def __init__(self, transport: asyncio.Transport, flow: FlowControl | None, date: DateLine,
                 on_close: Callable[[], None]) -> None:
        self._transport = transport
        self._flow = flow
        self._date = date
        self.on_close = on_close  # called when an answer ends the connection
        self._waiters: list[asyncio.Future[None]] = []
        self.lost = False
        self.begin(keep_alive=True, http10=False, head_only=False)

    def retarget(self, transport: asyncio.Transport, flow: FlowControl) -> None:
        """Write to ``transport`` from now on (the loop's, replacing a ``Held`` one, which never pauses writing)."""
        self._transport = transport
        self._flow = flow
        self.on_close = transport.close

    def begin(self, *, keep_alive: bool, http10: bool, head_only: bool) -> None:
        """Ready for the next request's answer."""
        self.keep_alive = keep_alive
        self._http10 = http10
        self._head_only = head_only
        self._status = 0
        self.headers: Headers = ()
        self._left: int | None = None
        self._chunked = False
        self.given = False  # the (empty) request body was handed to the app
        self.complete = False  # the whole answer is written

    async def receive(self) -> Message:
        """ASGI receive: the empty body once, then (held) the disconnect, or at once once answered."""
        if not self.given:
            self.given = True
            return _REQUEST
        if not self.lost and not self.complete:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                self._waiters.remove(waiter)
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        """ASGI send: the start is kept until the first body part, so head and body leave in one write."""
        flow = self._flow
        if flow is not None and flow.write_paused and not self.lost:
            await flow.drain()
        if self.lost or self.complete:
            return
        if message["type"] == "http.response.start":
            self._status = message["status"]
            self.headers = message.get("headers", ())
            return
        body: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        head = self._head() if self._status else b""
        data = self._framed(body, more=more)
        if len(data) < SMALL:
            self._transport.write(head + data)
        else:
            self._transport.writelines((head, data))
        if not more:
            self._finish()

    def gone(self) -> None:
        """The connection was lost: every later send is dropped, a held receive returns the disconnect."""
        self.lost = True
        self._wake()

    def _finish(self) -> None:
        if self._left:
            msg = f"reply shorter than its content-length by {self._left} bytes"
            raise RuntimeError(msg)
        self.complete = True
        self._wake()
        if not self.keep_alive:
            self.on_close()

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _framed(self, body: bytes, *, more: bool) -> bytes:
        """The body part as it goes on the wire: counted against content-length, or as a chunk."""
        if self._chunked:
            chunk = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            return chunk if more else chunk + b"0\r\n\r\n"
        if self._left is None:
            return body
        if len(body) > self._left:
            msg = "reply longer than its content-length"
            raise RuntimeError(msg)
        self._left -= len(body)
        return body

    def _head(self) -> bytes:
        """Status line and headers of the answer, ``connection`` and framing decided here."""
        status = self._status
        self._status = 0
        lines = [STATUS_LINE[status], self._date.line]
        length: int | None = None
        for name, value in self.headers:
            if name == b"content-length":
                length = int(value)
            elif name == b"connection":
                if b"close" in value.lower():
                    self.keep_alive = False
                continue
            lines.append(name + b": " + value + b"\r\n")  # concatenated: a third of the time of bytes %
        bodiless = self._head_only or status in _NO_BODY or status < 200
        if length is None and not bodiless:
            if self._http10:
                self.keep_alive = False  # no chunked encoding in HTTP/1.0: the close ends the body
            else:
                self._chunked = True
                lines.append(b"transfer-encoding: chunked\r\n")
        self._left = None if bodiless else length
        if not self.keep_alive:
            lines.append(b"connection: close\r\n")
        elif self._http10:
            lines.append(b"connection: keep-alive\r\n")
        lines.append(b"\r\n")
        head = b"".join(lines)
        if head.count(b"\n") != len(lines):
            msg = "a response header name or value holds a line break"
            raise RuntimeError(msg)
        return head
