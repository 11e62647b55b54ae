"""Admin refreshes from the upstream source of truth (pull mode).

``POST /device-{metadata,userdata}/refresh/{id}`` fetches by id now, stores through the
normal write path and answers the stored value. Upstream 404 → 404; no upstream
configured → 409; upstream failure → 502 (never hollow's panic or empty 200).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from imds.errors import LookupDisabled
from imds.models import METADATA, USERDATA
from imds.services import Services
from imds.services.lookup.pull import Lookup
from imds.services.records.wire import parse_instance_id
from imds.services.render.json import metadata_bytes
from imds.web.admin.auth import ID_EXTRA, authorize
from imds.web.errors import JSON, documented


def refresh_router(services: Services) -> APIRouter:
    """The refresh routes, bound to ``services``."""
    router = APIRouter(tags=["admin"], responses=documented(400, 401, 403, 404, 409, 502, 503))

    def lookup() -> Lookup:
        if services.lookup is None:
            raise LookupDisabled
        return services.lookup

    @router.post("/device-metadata/refresh/{instance_id}", summary="Fetch metadata from upstream now and store it",
                 openapi_extra=ID_EXTRA)
    async def refresh_metadata(request: Request, instance_id: str) -> Response:
        subject = await authorize(services, request)
        instance = await lookup().refresh(METADATA, parse_instance_id(instance_id), subject=subject)
        return Response(metadata_bytes(instance, services.templates), media_type=JSON)

    @router.post("/device-userdata/refresh/{instance_id}", summary="Fetch userdata from upstream now and store it",
                 openapi_extra=ID_EXTRA)
    async def refresh_userdata(request: Request, instance_id: str) -> Response:
        subject = await authorize(services, request)
        instance = await lookup().refresh(USERDATA, parse_instance_id(instance_id), subject=subject)
        return Response(instance.userdata or b"", media_type="application/octet-stream")

    return router
