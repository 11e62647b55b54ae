"""The one table mapping imds errors to HTTP statuses, and the JSON error body.

Body shape (hollow's, with named fields)::

    {"message": "invalid request",
     "errors": [{"field": "ipAddresses[3]", "message": "'x' is not an IP address or CIDR"}]}
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import Response

from imds.errors import (
    AuthNotConfigured,
    Conflict,
    Forbidden,
    HeadersTooLarge,
    HeadTooLarge,
    ImdsError,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    Problem,
    RateLimited,
    Refused,
    RequestTimeout,
    StoreUnavailable,
    Unauthenticated,
    UpstreamError,
)

# First match wins, so subclasses come before their bases.
STATUS: tuple[tuple[type[ImdsError], int], ...] = (
    (PayloadTooLarge, 413),
    (HeadersTooLarge, 431),
    (HeadTooLarge, 431),
    (RequestTimeout, 408),
    (InvalidInput, 400),
    (NotFound, 404),
    (RateLimited, 429),
    (Unauthenticated, 401),
    (AuthNotConfigured, 401),
    (Forbidden, 403),
    (Refused, 403),
    (Conflict, 409),
    (StoreUnavailable, 503),
    (UpstreamError, 502),
    (ImdsError, 500),
)

JSON = "application/json"

_ERROR_SCHEMA = {
    "type": "object",
    "required": ["message"],
    "properties": {
        "message": {"type": "string"},
        "errors": {"type": "array", "items": {"type": "object", "properties": {
            "field": {"type": "string"}, "message": {"type": "string"}}}},
    },
}
_MEANINGS = {
    400: "Invalid request: errors[] names each offending field (and the flag of any limit).",
    401: "Missing or invalid credentials.",
    403: "The token holds none of the scopes the route needs.",
    404: "No such record, or no such route.",
    409: "The request conflicts with the configuration (e.g. a refresh without --lookup-url).",
    413: "The body is larger than --max-body-bytes.",
    502: "The upstream source of truth failed.",
    503: "The database is unavailable.",
}


def documented(*statuses: int) -> dict[int | str, dict[str, object]]:
    """OpenAPI ``responses`` for the error statuses a router's routes answer, with the error body schema."""
    return {
        status: {"description": _MEANINGS[status], "content": {JSON: {"schema": _ERROR_SCHEMA}}} for status in statuses
    }


def status_for(exc: ImdsError) -> int:
    """The HTTP status for an imds error: its class's first ``STATUS`` row, found once per class."""
    kind = type(exc)
    status = _STATUS_OF.get(kind)
    if status is None:
        status = _STATUS_OF[kind] = next(status for base, status in STATUS if issubclass(kind, base))
    return status


_STATUS_OF: dict[type[ImdsError], int] = {}  # one entry per error class met (a few dozen at most)


def error_body(message: str, exc: ImdsError | None = None) -> bytes:
    """The JSON error body; field problems are listed for InvalidInput."""
    if not isinstance(exc, InvalidInput):  # json.dumps({"message": message}), byte for byte, without the dict
        return b'{"message": %b}' % json.dumps(message).encode()
    body: dict[str, object] = {"message": message}
    body["errors"] = [{"field": p.field, "message": p.message} for p in exc.problems]
    return json.dumps(body).encode()


def error_parts(exc: ImdsError) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """(status, body, extra headers) for an imds error."""
    status = status_for(exc)
    headers = [(b"www-authenticate", b'Bearer realm="imds"')] if status == 401 else []
    if isinstance(exc, RateLimited):
        headers.append((b"retry-after", str(exc.retry_after).encode()))
    return status, error_body(exc.message, exc), headers


async def handle_imds_error(_request: Request, exc: Exception) -> Response:
    """Starlette exception handler for the admin app."""
    assert isinstance(exc, ImdsError)  # noqa: S101 - registered for ImdsError only
    status, body, headers = error_parts(exc)
    return Response(body, status_code=status, media_type=JSON, headers={k.decode(): v.decode() for k, v in headers})


async def handle_invalid_parameters(request: Request, exc: Exception) -> Response:
    """FastAPI's parameter errors (a query that is no integer, one missing) as a 400 naming each field.

    FastAPI's own answer is a 422 that echoes the input back; this one names ``query.after``
    and what it must be, never the value sent.
    """
    found = getattr(exc, "errors", None)
    errors = found() if callable(found) else []
    problems = [Problem(".".join(str(part) for part in error.get("loc", ())) or "request",
                        str(error.get("msg", "is invalid"))) for error in errors]
    return await handle_imds_error(request, InvalidInput(problems or [Problem("request", "is invalid")]))


async def handle_unexpected(_request: Request, _exc: Exception) -> Response:
    """A bug: JSON 500 without details (the front logs it with its traceback, never with the body)."""
    return Response(error_body("internal error"), status_code=500, media_type=JSON)


async def handle_http_error(_request: Request, exc: Exception) -> Response:
    """Framework errors (unknown route, wrong method) as JSON in the same shape."""
    status = getattr(exc, "status_code", 500)
    detail = getattr(exc, "detail", None) or "error"
    message = "not found" if status == 404 else str(detail).lower()
    headers = getattr(exc, "headers", None)
    return Response(error_body(message), status_code=status, media_type=JSON, headers=headers)
