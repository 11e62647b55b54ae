"""Reading request bodies with a size limit."""

from __future__ import annotations

from starlette.requests import Request

from imds.errors import InvalidInput, PayloadTooLarge


async def read_limited(request: Request, limit: int) -> bytes:
    """The whole body, or PayloadTooLarge as soon as it is known to exceed ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):  # "²".isdigit() is True
            raise InvalidInput.one("Content-Length", "must be a number")
        if len(declared.lstrip("0")) > len(str(limit)) or int(declared) > limit:
            raise PayloadTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)
