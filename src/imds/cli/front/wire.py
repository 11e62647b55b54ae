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

    The kept-alive HTTP/1.1 shape (``head``, ``whole``: with the ``date`` line) is made for
    the ``date`` it was last asked with; an answer that closes the connection (a boot's crawl:
    each answer asked once, a new connection each) is joined from the parts, nothing kept.
    """

    __slots__ = ("date", "fields", "head", "status", "whole")

    def __init__(self, found: Remembered) -> None:
        lines = [name + b": " + value + b"\r\n" for name, value in found.headers]
        self.fields = b"".join(lines)
        if self.fields.count(b"\n") != len(lines):  # a header must never split the answer
            msg = "a response header name or value holds a line break"
            raise RuntimeError(msg)
        self.status = STATUS_LINE[found.status]
        self.date: bytes | None = None
        self.head = self.whole = b""


def recalled(found: Remembered, date: bytes, *, head_only: bool, keep_alive: bool, http10: bool) -> bytes:
    """The bytes answering a remembered read (``Last`` when the connection closes after it).

    The common shape (HTTP/1.1, kept alive) is built once per ``date`` and kept on ``found``.
    """
    wire = found.wire
    if not isinstance(wire, Wire):
        wire = found.wire = Wire(found)
    if keep_alive and not http10:
        if wire.date is not date:
            wire.date = date
            wire.head = b"".join((wire.status, date, wire.fields, b"\r\n"))
            wire.whole = wire.head + found.body
        return wire.head if head_only else wire.whole
    answer = b"".join((wire.status, date, wire.fields, _KEEP if keep_alive else _CLOSE, b"\r\n",
                       b"" if head_only else found.body))
    return answer if keep_alive else Last(answer)


def refusal(exc: ImdsError, date: bytes) -> Last:
    """The JSON answer to ``exc`` (status from ``imds.web.errors``), closing the connection."""
    status, body, extra = error_parts(exc)
    lines = [STATUS_LINE[status], date, *(b"%b: %b\r\n" % pair for pair in extra),
             b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body), body]
    return Last(b"".join(lines))
