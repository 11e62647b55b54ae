"""What every admin router shares: the bearer-token check and the ``{instance_id}`` path parameter."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from imds.services import Services
from imds.services.admission.auth import require

ID_PARAM = {"name": "instance_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}
ID_EXTRA: dict[str, Any] = {"parameters": [ID_PARAM]}  # openapi_extra for a route taking {instance_id}


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


async def authorize(services: Services, request: Request, needed: tuple[str, ...]) -> str:
    """The caller's subject, if its bearer token holds one of ``needed``; else an AuthError."""
    principal = await services.auth.authenticate(_bearer(request))
    require(principal, needed)
    return principal.subject
