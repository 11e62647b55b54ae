"""Admin routes of the Ganeti OS record and the loaded OS definitions.

``POST /device-os`` replaces an instance's OS record (scopes as the other record types,
kind ``os``: ``write``/``create``/``update``/``metadata:create:os``/``metadata:update:os``);
``GET``/``HEAD``/``DELETE /device-os/{id}``; ``GET /os-definitions[/{name}]`` (read
scopes). No response, error body or log line carries a private or secret value.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from imds.errors import NotFound
from imds.models import OS_KIND
from imds.services import Services
from imds.services.ganeti.wire import parse_os_write
from imds.services.records.wire import parse_instance_id, parse_json
from imds.services.render.json import encode
from imds.web.admin.auth import ID_EXTRA, authorize, record_schema, request_body
from imds.web.body import read_limited
from imds.web.errors import JSON, documented

_PARAMS = {
    "type": "object",
    "additionalProperties": {
        "type": "object",
        "required": ["value"],
        "properties": {"value": {"type": "string"}, "visibility": {"enum": ["public", "private", "secret"]}},
    },
    "description": "NAME ([a-z0-9_-]{1,64}) → value and visibility (default public).",
}
OS_SCHEMA = record_schema(
    ("os_type", "mode"),
    os_type={"type": "string"},
    mode={"enum": ["run", "install", "self_install"]},
    communication={"type": "boolean"},
    parameters=_PARAMS,
    install_parameters=_PARAMS,
    package={"type": "object", "required": ["url"], "properties": {
        "url": {"type": "string", "description": "http(s) URL ending in .tar.gz or .tgz"},
        "username": {"type": "string"}, "password": {"type": "string"},
    }},
    updated_at={"type": "string", "description": "Older than the stored one: nothing changes."},
)


def ganeti_admin_router(services: Services) -> APIRouter:
    """The OS record and OS definition routes, bound to ``services``."""
    router = APIRouter(tags=["ganeti"], responses=documented(400, 401, 403, 404, 413, 503))
    records = services.os
    settings = services.settings

    @router.post("/device-os", summary="Create or replace the Ganeti OS record", openapi_extra=request_body(OS_SCHEMA))
    async def post_os(request: Request) -> Response:
        subject = await authorize(services, request)
        raw = parse_json(await read_limited(request, settings.limits.max_body_bytes))
        write = parse_os_write(raw, max_value_bytes=settings.ganeti.os_param_max_bytes)
        del raw  # the parsed write wraps every private and secret value
        result = await records.put(write, subject=subject)
        body: dict[str, Any] = {"id": result.instance_id, "applied": result.applied}
        if result.reason is not None:
            body["reason"] = result.reason
        header = {"X-Imds-Write": "applied" if result.applied else "stale"}
        return Response(encode(body), media_type=JSON, headers=header)

    # GET and HEAD are separate routes so each gets its own OpenAPI operation id.
    @router.get("/device-os/{instance_id}", summary="Read the OS record (no private or secret value)",
                openapi_extra=ID_EXTRA)
    @router.head("/device-os/{instance_id}", summary="Headers of the OS record read", openapi_extra=ID_EXTRA)
    async def get_os(request: Request, instance_id: str) -> Response:
        body = encode(await records.view(parse_instance_id(instance_id)))
        if request.method == "HEAD":
            return Response(media_type=JSON, headers={"content-length": str(len(body))})
        return Response(body, media_type=JSON)

    @router.delete("/device-os/{instance_id}", summary="Delete the OS record (and its secrets)")
    async def delete_os(request: Request, instance_id: str) -> Response:
        subject = await authorize(services, request)
        await records.delete(parse_instance_id(instance_id), subject=subject)
        return Response(encode({"id": instance_id.lower(), "deleted": OS_KIND}), media_type=JSON)

    @router.get("/os-definitions", summary="The loaded Ganeti OS definitions")
    async def list_definitions() -> Response:
        found = [d.summary() for name in records.definitions.names() if (d := records.definitions.get(name))]
        return Response(encode({"os_definitions": found}), media_type=JSON)

    @router.get("/os-definitions/{name}", summary="One loaded Ganeti OS definition")
    async def get_definition(name: str) -> Response:
        definition = records.definitions.get(name) if name in records.definitions.names() else None
        if definition is None:
            msg = f"no OS definition {name[:64]!r}"
            raise NotFound(msg)
        return Response(encode(definition.summary()), media_type=JSON)

    return router
