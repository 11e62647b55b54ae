"""What the instance flavors share: plain-text replies, the userdata type, a bounded body read; the reply head."""

from __future__ import annotations

from http import HTTPStatus

from imds.errors import Conflict, ImdsError, InvalidInput
from imds.models import Instance
from imds.web.errors import status_for
from imds.web.routing import BINARY, READ_METHODS, TEXT, InstanceCall, Receive, Reply, Scope, header


def plain(status: int) -> Reply:
    """A plain-text error reply, EC2/Nova style: ``404 - Not Found``."""
    return Reply(status, f"{status} - {HTTPStatus(status).phrase}".encode())


def plain_error(exc: ImdsError) -> Reply:
    """A plain-text error reply; a 400 or 409 also says why (``400 - Bad Request: body: …``)."""
    status = status_for(exc)
    if isinstance(exc, InvalidInput):
        reason = "; ".join(f"{problem.field}: {problem.message}" for problem in exc.problems)
    elif isinstance(exc, Conflict):
        reason = exc.message
    else:
        return plain(status)
    return Reply(status, f"{status} - {HTTPStatus(status).phrase}: {reason}".encode())


def text_or_binary(data: bytes) -> bytes:
    """The content type for userdata: text when it is UTF-8, else octet-stream."""
    try:
        data.decode()
    except UnicodeDecodeError:
        return BINARY
    return TEXT


def userdata_type(instance: Instance) -> bytes:
    """The content type of the instance's userdata (see ``text_or_binary``)."""
    return text_or_binary(instance.userdata or b"")


def declared_over(scope: Scope, limit: int) -> bool:
    """Whether the request's Content-Length already says its body is over ``limit`` bytes."""
    declared = header(scope, b"content-length")
    return declared is not None and declared.isdigit() and int(declared) > limit


async def read_body(receive: Receive, limit: int, noun: str = "a password") -> bytes:
    """The request body, or InvalidInput as soon as it is over ``limit`` bytes (``noun`` names it)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise InvalidInput.one("body", "the client went away before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise InvalidInput.one("body", f"{noun} is at most {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def reply_head(call: InstanceCall, reply: Reply) -> tuple[int, list[tuple[bytes, bytes]]]:
    """The status and headers answering ``reply``: with the instance's ETag on a 200 read.

    A read whose ``If-None-Match`` names that ETag (or ``*``) is answered 304 with no body:
    the document the caller holds is current (RFC 9110, weak comparison).
    """
    entry = call.version
    if entry is not None and reply.status == 200 and call.scope["method"] in READ_METHODS:
        etag = entry.etag
        held = header(call.scope, b"if-none-match")
        if held is not None and _names(held, etag):
            return 304, [*reply.headers, (b"etag", etag)]
        return 200, [*reply.headers, (b"content-type", reply.content_type),
                     (b"content-length", str(len(reply.body)).encode()), (b"etag", etag)]
    return reply.status, [*reply.headers, (b"content-type", reply.content_type),
                          (b"content-length", str(len(reply.body)).encode())]


def _names(if_none_match: str, etag: bytes) -> bool:
    """Whether an ``If-None-Match`` value lists ``etag`` (weakly: ``W/`` ignored) or is ``*``."""
    wanted = etag.decode("latin-1")
    for tag in if_none_match.split(","):
        tag = tag.strip()  # noqa: PLW2901 - the list item, trimmed
        if tag in ("*", wanted) or tag.removeprefix("W/") == wanted:
            return True
    return False
