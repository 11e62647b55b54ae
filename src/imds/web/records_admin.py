"""Whole records by id, for operators' tools (``imds get|list|export --url``).

``GET /device-records`` streams every stored instance as JSON lines, and
``GET /device-records/{id}`` answers one, each in the upsert wire format
(``imds.services.records_io``): what ``POST /device-metadata`` / ``/device-userdata``
accept, so an export is also an import. Both need a read scope for metadata *and* one for
userdata, since both come back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from imds.models import METADATA, USERDATA
from imds.services import Services
from imds.services.auth import read_scopes
from imds.services.records_io import stored_instance, stored_instances, to_wire
from imds.services.render.json import encode
from imds.services.wire import parse_instance_id
from imds.web.admin import ID_PARAM, authorize
from imds.web.errors import JSON

NDJSON = "application/x-ndjson"


def records_admin_router(services: Services) -> APIRouter:
    """``/device-records`` and ``/device-records/{id}``, bound to ``services``."""
    router = APIRouter(tags=["admin"])

    async def authorize_both(request: Request) -> None:
        await authorize(services, request, read_scopes(METADATA))
        await authorize(services, request, read_scopes(USERDATA))

    @router.get("/device-records", summary="Every instance record, as JSON lines in the upsert format",
                response_class=StreamingResponse)
    async def list_records(request: Request) -> StreamingResponse:
        await authorize_both(request)
        instances = await stored_instances(services.store)

        def lines() -> Iterator[bytes]:
            for instance in instances:
                yield json.dumps(to_wire(instance), separators=(",", ":")).encode() + b"\n"

        return StreamingResponse(lines(), media_type=NDJSON)

    @router.get("/device-records/{instance_id}", summary="One instance record in the upsert format",
                openapi_extra={"parameters": [ID_PARAM]})
    async def get_record(request: Request, instance_id: str) -> Response:
        await authorize_both(request)
        instance = await stored_instance(services.store, parse_instance_id(instance_id))
        return Response(encode(to_wire(instance)), media_type=JSON)

    return router
