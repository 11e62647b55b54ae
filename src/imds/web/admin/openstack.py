"""Admin routes of the OpenStack parts: config drive images and clearing the instance's password.

``GET /device-configdrive/{id}[?format=nocloud]`` (read scopes) answers the ISO image
(``application/x-iso9660-image``): an OpenStack config drive (label ``config-2``) or a
NoCloud seed (label ``cidata``), built from the same renderers the instance-facing flavors
serve. ``DELETE /device-password/{id}`` (delete scopes) clears the password the instance
posted, so it may post a new one; 404 when it has none.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from imds.services import Services
from imds.services.drives import CONFIG_2, MEDIA_TYPE, build_drive, drive_format
from imds.services.records.upsert import PASSWORD
from imds.services.records.wire import parse_instance_id
from imds.services.render.json import encode
from imds.web.admin.auth import ID_EXTRA, authorize
from imds.web.errors import JSON, documented


def openstack_admin_router(services: Services) -> APIRouter:
    """The config drive and password routes, bound to ``services``."""
    router = APIRouter(tags=["admin"], responses=documented(400, 401, 403, 404, 503))
    records = services.records

    @router.get(
        "/device-configdrive/{instance_id}", summary="Config drive ISO (config-2, or a NoCloud cidata seed)",
        openapi_extra=ID_EXTRA, response_class=Response,
    )
    async def get_configdrive(
        instance_id: str,
        fmt: Annotated[str, Query(alias="format", description="config-2 or nocloud")] = CONFIG_2,
    ) -> Response:
        kind = drive_format(fmt)
        drive = await build_drive(records, parse_instance_id(instance_id), kind)
        disposition = f'attachment; filename="{drive.filename}"'
        return Response(drive.data, media_type=MEDIA_TYPE, headers={"content-disposition": disposition})

    @router.delete("/device-password/{instance_id}", summary="Clear the password the instance posted")
    async def delete_password(request: Request, instance_id: str) -> Response:
        subject = await authorize(services, request)
        await records.clear_password(parse_instance_id(instance_id), subject=subject)
        return Response(encode({"id": instance_id.lower(), "deleted": PASSWORD}), media_type=JSON)

    return router
