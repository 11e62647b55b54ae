"""``GET /audit``: the audit log of admin writes and deletes (read scope).

Query: ``instance`` (an instance id, ``project:<id>`` for a GCE project's attributes or
``notice:<id>`` for a lifecycle notice; default every entry), ``after`` (the cursor: the
``next`` of the previous page; default 0) and ``limit`` (1-1000, default 100). Entries are
oldest first::

    {"entries": [{"seq": 7, "at": "...", "subject": "ci-bot", "instance_id": "...",
                  "action": "write", "kind": "metadata", "applied": true,
                  "detail": {"addresses": 2, "moved": {"10.0.0.5": "<previous holder>"}, "dropped": []}}],
     "next": 7}
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from starlette.responses import Response

from imds.models import NoticeKey, ProjectKey
from imds.services import Services
from imds.services.notices.wire import parse_notice_id
from imds.services.records.projects import parse_project_id
from imds.services.records.wire import parse_instance_id
from imds.services.render.json import encode
from imds.web.errors import JSON, documented


def audit_router(services: Services) -> APIRouter:
    """The audit log route, bound to ``services``."""
    router = APIRouter(tags=["admin"], responses=documented(400, 401, 403, 503))

    @router.get("/audit", summary="Audit log of admin writes and deletes", response_class=Response)
    async def audit(
        instance: Annotated[str | None, Query(description="only this instance id, project:<id> or notice:<id>")] = None,
        after: Annotated[int, Query(description="cursor: the next of the previous page")] = 0,
        limit: Annotated[int, Query(description="entries per page, 1 to 1000")] = 100,
    ) -> Response:
        instance_id = None if instance is None else _subject_id(instance)
        entries = await services.audit.page(instance_id, after, limit)
        body = {
            "entries": [
                {"seq": e.seq, "at": e.at.isoformat(), "subject": e.event.subject,
                 "instance_id": e.event.instance_id, "action": e.event.action, "kind": e.event.kind,
                 "applied": e.event.applied, "detail": e.event.detail}
                for e in entries
            ],
            "next": entries[-1].seq if entries else after,
        }
        return Response(encode(body), media_type=JSON)

    return router


def _subject_id(text: str) -> str:
    """An instance id, a project's ``project:<id>`` or a notice's ``notice:<id>``, as the log holds them."""
    if (notice := NoticeKey.parse(text)) is not None:
        return str(NoticeKey(parse_notice_id(notice.id, "instance")))
    project = ProjectKey.parse(text)
    return parse_instance_id(text) if project is None else str(ProjectKey(parse_project_id(project.id)))
