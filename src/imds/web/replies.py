"""What the instance flavors share: plain-text replies, the userdata content type, a bounded body read."""

from __future__ import annotations

from http import HTTPStatus

from imds.errors import Conflict, ImdsError, InvalidInput
from imds.models import Instance
from imds.web.errors import status_for
from imds.web.routing import BINARY, TEXT, Receive, Reply, Scope, header


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
