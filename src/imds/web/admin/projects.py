"""GCE project attributes: ``PUT``/``GET``/``HEAD``/``DELETE /projects/{project_id}/attributes``.

The body of a ``PUT`` is the project's whole attributes object (string values; at most
``--max-body-bytes``); it answers the stored record with its revision. Scopes as the other
record types, kind ``project``: ``write``/``create``/``update``/``metadata:create:project``/
``metadata:update:project`` to write, ``read``/``metadata:read:project`` to read,
``write``/``delete``/``metadata:delete:project`` to delete. Rules: ``imds.services.records.projects``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from imds.models import PROJECT_KIND, ProjectAttributes
from imds.services import Services
from imds.services.records.projects import parse_attributes, parse_project_id
from imds.services.records.wire import parse_json
from imds.services.render.json import encode
from imds.web.admin.auth import authorize, request_body
from imds.web.body import read_limited
from imds.web.errors import JSON, documented

_PATH = "/projects/{project_id}/attributes"
_PROJECT_PARAM = {"name": "project_id", "in": "path", "required": True,
                  "schema": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,27}$"}}
_ATTRIBUTES = {"type": "object", "additionalProperties": {"type": "string"},
               "description": "GCE project attributes: names (1-128 letters, digits, '-', '_') to string values."}


def _view(record: ProjectAttributes) -> dict[str, Any]:
    return {"project_id": record.project_id, "attributes": record.attributes, "revision": record.revision,
            "updated_at": record.updated_at.isoformat()}


def projects_router(services: Services) -> APIRouter:
    """The project attributes routes, bound to ``services``."""
    router = APIRouter(tags=["gce"], responses=documented(400, 401, 403, 404, 413, 503))
    projects = services.projects
    extra: dict[str, Any] = {"parameters": [_PROJECT_PARAM]}

    @router.put(_PATH, summary="Create or replace a project's attributes (GCE project/attributes/)",
                openapi_extra={**extra, **request_body(_ATTRIBUTES)})
    async def put_attributes(request: Request, project_id: str) -> Response:
        subject = await authorize(services, request)
        project = parse_project_id(project_id)
        raw = parse_json(await read_limited(request, services.settings.limits.max_body_bytes))
        record = await projects.put(project, parse_attributes(raw, services.limits), subject=subject)
        return Response(encode(_view(record)), media_type=JSON)

    # GET and HEAD are separate routes so each gets its own OpenAPI operation id.
    @router.get(_PATH, summary="Read a project's attributes", openapi_extra=extra)
    @router.head(_PATH, summary="Headers of the project attributes read", openapi_extra=extra)
    async def get_attributes(request: Request, project_id: str) -> Response:
        body = encode(_view(await projects.get(parse_project_id(project_id))))
        if request.method == "HEAD":
            return Response(media_type=JSON, headers={"content-length": str(len(body))})
        return Response(body, media_type=JSON)

    @router.delete(_PATH, summary="Delete a project's attributes")
    async def delete_attributes(request: Request, project_id: str) -> Response:
        subject = await authorize(services, request)
        project = parse_project_id(project_id)
        await projects.delete(project, subject=subject)
        return Response(encode({"project_id": project, "deleted": PROJECT_KIND}), media_type=JSON)

    return router
