"""Lifecycle notices: ``POST``/``GET /device-notices``, ``GET``/``HEAD``/``PATCH``/``DELETE /device-notices/{id}``.

A ``POST`` stores a new notice (body: ``imds.services.notices.wire``, at most
``--max-body-bytes``) and answers it with its id; a ``PATCH`` changes what it names; a
``DELETE`` removes the notice. ``GET /device-notices`` lists the stored notices, oldest first,
filtered by ``instance_id`` (those reaching that instance: its own, its project's and its
facility's), ``project_id``, ``facility``, ``kind`` and ``history`` (``true``: canceled or
completed, ``false``: current). Each notice shows ``state`` as guests see it now and the
guests' acknowledgements. Scopes as the other record types, kind ``notice``:
``write``/``create``/``update``/``metadata:create:notice``/``metadata:update:notice`` to write,
``read``/``metadata:read:notice`` to read, ``write``/``delete``/``metadata:delete:notice`` to
delete. Rules: ``imds.services.notices.records``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from imds.errors import InvalidInput
from imds.models import NOTICE_KIND, NOTICE_KINDS, Acknowledgement, Notice
from imds.services import Services
from imds.services.admission.auth import delete_scopes, read_scopes, upsert_scopes
from imds.services.notices.wire import FACILITY, notice_view, parse_changes, parse_create, parse_notice_id
from imds.services.records.projects import parse_project_id
from imds.services.records.wire import parse_instance_id, parse_json
from imds.services.render.json import encode
from imds.web.admin.auth import authorize, request_body
from imds.web.body import read_limited
from imds.web.errors import JSON, documented

_ID_PARAM = {"name": "notice_id", "in": "path", "required": True,
             "schema": {"type": "string", "pattern": "^[0-9a-f]{17}$"}}
_NOTICE = {"type": "object", "description": "A lifecycle notice (see docs/admin-api.md#lifecycle-notices).",
           "properties": {"instance_id": {"type": "string", "format": "uuid"}, "project_id": {"type": "string"},
                          "facility": {"type": "string"}, "kind": {"enum": list(NOTICE_KINDS)},
                          "time": {"type": "string", "format": "date-time"},
                          "window_end": {"type": ["string", "null"], "format": "date-time"},
                          "state": {"enum": ["scheduled", "active", "canceled", "completed"]},
                          "description": {"type": "string", "maxLength": 255},
                          "target_state": {"type": ["string", "null"]}}}
Filter = Annotated[str | None, Query()]


def _answer(request: Request, body: dict[str, Any]) -> Response:
    data = encode(body)
    if request.method == "HEAD":
        return Response(media_type=JSON, headers={"content-length": str(len(data))})
    return Response(data, media_type=JSON)


def notices_router(services: Services) -> APIRouter:
    """The notice routes, bound to ``services``."""
    router = APIRouter(tags=["notices"], responses=documented(400, 401, 403, 404, 409, 413, 503))
    notices = services.notices
    extra: dict[str, Any] = {"parameters": [_ID_PARAM]}

    def view(notice: Notice, acks: list[Acknowledgement]) -> dict[str, Any]:
        return notice_view(notice, notices.now(), acks)

    async def body(request: Request) -> Any:
        return parse_json(await read_limited(request, services.settings.limits.max_body_bytes))

    @router.post("/device-notices", summary="Tell an instance, a project or a facility what is about to happen to it",
                 openapi_extra=request_body(_NOTICE))
    async def create_notice(request: Request) -> Response:
        subject = await authorize(services, request, upsert_scopes(NOTICE_KIND))
        notice = await notices.create(parse_create(await body(request)), subject=subject)
        return Response(encode(view(notice, [])), media_type=JSON)

    @router.get("/device-notices", summary="The stored notices, oldest first, filtered")
    async def list_notices(  # noqa: PLR0913 - one parameter per filter
        request: Request, *, instance_id: Filter = None, project_id: Filter = None, facility: Filter = None,
        kind: Filter = None, history: Annotated[bool | None, Query()] = None,
    ) -> Response:
        await authorize(services, request, read_scopes(NOTICE_KIND))
        if kind is not None and kind not in NOTICE_KINDS:
            raise InvalidInput.one("kind", f"must be one of {', '.join(NOTICE_KINDS)}")
        if facility is not None and FACILITY.fullmatch(facility) is None:
            raise InvalidInput.one("facility", "must be 1-64 of letters, digits, '.', '_' and '-'")
        found = await notices.find(
            instance_id=None if instance_id is None else parse_instance_id(instance_id, "instance_id"),
            project_id=None if project_id is None else parse_project_id(project_id), facility=facility, kind=kind,
            history=history)
        return Response(encode({"notices": [view(notice, acks) for notice, acks in found]}), media_type=JSON)

    # GET and HEAD are separate routes so each gets its own OpenAPI operation id.
    @router.get("/device-notices/{notice_id}", summary="One notice, with the guests' acknowledgements",
                openapi_extra=extra)
    @router.head("/device-notices/{notice_id}", summary="Headers of the notice read", openapi_extra=extra)
    async def get_notice(request: Request, notice_id: str) -> Response:
        await authorize(services, request, read_scopes(NOTICE_KIND))
        return _answer(request, view(*await notices.get(parse_notice_id(notice_id))))

    @router.patch("/device-notices/{notice_id}", summary="Change a notice (state, times, description)",
                  openapi_extra={**extra, **request_body(_NOTICE)})
    async def change_notice(request: Request, notice_id: str) -> Response:
        subject = await authorize(services, request, upsert_scopes(NOTICE_KIND))
        known = parse_notice_id(notice_id)
        notice = await notices.change(known, parse_changes(await body(request)), subject=subject)
        _, acks = await notices.get(notice.id)
        return Response(encode(view(notice, acks)), media_type=JSON)

    @router.delete("/device-notices/{notice_id}", summary="Delete a notice and its acknowledgements",
                   openapi_extra=extra)
    async def delete_notice(request: Request, notice_id: str) -> Response:
        subject = await authorize(services, request, delete_scopes(NOTICE_KIND))
        known = parse_notice_id(notice_id)
        await notices.delete(known, subject=subject)
        return Response(encode({"id": known, "deleted": NOTICE_KIND}), media_type=JSON)

    return router
