"""Whole answers the front writes itself: remembered reads and refusals, as bytes ready to go."""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from imds.errors import ImdsError
from imds.web.errors import error_parts
from imds.web.memo import Remembered

_CLOSE = b"connection: close\r\n"
_KEEP = b"connection: keep-alive\r\n"


class Last(bytes):
    """A whole answer after which the connection closes (a refusal, or an answer to ``Connection: close``)."""

    __slots__ = ()


class Wire:
    """A remembered answer as the front writes it: its status line and header lines, made once.

    The kept-alive HTTP/1.1 shape (``head``; ``whole``, with ``body``, the body it was made
    for) is made for the ``date`` it was last asked with; an answer that closes the connection
    (a boot's crawl: each answer asked once, a new connection each) is joined from the parts,
    nothing kept. Answers recalled anew from one kept answer (``Remembered.origin``) share its
    wire: a fresh seed changes the body only (of the same length), a token's TTL adds its line
    before the kept header lines.
    """

    __slots__ = ("body", "date", "fields", "head", "status", "whole")

    def __init__(self, status: int, fields: bytes, body: bytes) -> None:
        self.status = STATUS_LINE[status]
        self.fields = fields
        self.body = body
        self.date: bytes | None = None
        self.head = self.whole = b""


def header_lines(headers: tuple[tuple[bytes, bytes], ...]) -> bytes:
    """``name: value`` lines, each ending in CRLF; a line break inside a name or value is refused."""
    lines = [name + b": " + value + b"\r\n" for name, value in headers]
    fields = b"".join(lines)
    if fields.count(b"\n") != len(lines):  # a header must never split the answer
        msg = "a response header name or value holds a line break"
        raise RuntimeError(msg)
    return fields


def wire_of(found: Remembered) -> Wire:
    """``found``'s wire (kept on it): made once per kept answer, shared or extended by what is recalled from it."""
    wire = found.wire
    if isinstance(wire, Wire):
        return wire
    origin = found.origin
    if origin is None:
        wire = Wire(found.status, header_lines(found.headers), found.body)
    else:
        base = wire_of(origin)
        said = len(found.headers) - len(origin.headers)  # the gate's lines go first (``ReadMemo.recall``)
        wire = base if not said else Wire(found.status, header_lines(found.headers[:said]) + base.fields, origin.body)
    found.wire = wire
    return wire


def recalled(found: Remembered, date: bytes, *, head_only: bool, keep_alive: bool, http10: bool) -> bytes:
    """The bytes answering a remembered read (``Last`` when the connection closes after it).

    The common shape (HTTP/1.1, kept alive) is built once per ``date`` and kept on the wire;
    a body made anew (a fresh seed) follows the kept head.
    """
    wire = found.wire
    if not isinstance(wire, Wire):  # made once per kept answer: the repeated read skips the call
        wire = wire_of(found)
    if keep_alive and not http10:
        if wire.date is not date:
            wire.date, wire.whole = date, b""
            wire.head = b"".join((wire.status, date, wire.fields, b"\r\n"))
        if head_only:
            return wire.head
        if found.body is not wire.body:
            return wire.head + found.body
        if not wire.whole:
            wire.whole = wire.head + wire.body
        return wire.whole
    answer = b"".join((wire.status, date, wire.fields, _KEEP if keep_alive else _CLOSE, b"\r\n",
                       b"" if head_only else found.body))
    return answer if keep_alive else Last(answer)


def refusal(exc: ImdsError, date: bytes) -> Last:
    """The JSON answer to ``exc`` (status from ``imds.web.errors``), closing the connection."""
    status, body, extra = error_parts(exc)
    lines = [STATUS_LINE[status], date, *(b"%b: %b\r\n" % pair for pair in extra),
             b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body), body]
    return Last(b"".join(lines))
