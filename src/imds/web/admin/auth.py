"""What every admin router shares: the bearer-token check, the ``{instance_id}`` path parameter, record schemas."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from imds.models import Principal
from imds.services import Services
from imds.services.admission.auth import require

UUID = {"type": "string", "format": "uuid"}
ID_PARAM = {"name": "instance_id", "in": "path", "required": True, "schema": UUID}
ID_EXTRA: dict[str, Any] = {"parameters": [ID_PARAM]}  # openapi_extra for a route taking {instance_id}


def record_schema(required: tuple[str, ...], **properties: Any) -> dict[str, Any]:
    """The JSON schema of a record write: an object with its ``id`` (a UUID), ``required`` and ``properties``."""
    return {"type": "object", "required": ["id", *required], "properties": {"id": UUID, **properties}}


def request_body(schema: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` for a route whose required JSON body follows ``schema``."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


_PRINCIPAL = "imds.principal"  # the request's Principal, once authenticated (this module's key alone)


async def admit(services: Services, request: Request, groups: tuple[tuple[str, ...], ...]) -> Principal:
    """The caller, once its bearer token holds one scope of each of ``groups``; else an AuthError.

    The token is verified once per request (by the admin app's gate, ``imds.web.admin.scopes``,
    or by an endpoint the front calls directly); later checks reuse the principal.
    """
    principal = request.scope.get(_PRINCIPAL)
    if not isinstance(principal, Principal):
        principal = await services.auth.authenticate(_bearer(request))
        request.scope[_PRINCIPAL] = principal
    for needed in groups:
        require(principal, needed)
    return principal


async def authorize(services: Services, request: Request, *groups: tuple[str, ...]) -> str:
    """The caller's subject, if its bearer token holds one scope of each of ``groups``; else an AuthError."""
    return (await admit(services, request, groups)).subject
