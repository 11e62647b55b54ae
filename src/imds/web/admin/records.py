"""Whole records by id, for operators' tools (``imds get|list|export --url``).

``GET /device-records`` streams every stored instance as JSON lines, and
``GET /device-records/{id}`` answers one, each in the upsert wire format
(``imds.services.transfer.readout``): what ``POST /device-metadata`` / ``/device-userdata``
accept, so an export is also an import. Both need a read scope for metadata *and* one for
userdata, since both come back (``imds.web.admin.scopes``). A record with a Ganeti OS record
comes with it (``"os"``), which also needs an ``os`` read scope: ``GET /device-records``
shows private values decrypted (``?private=false`` leaves them out: ``imds export
--no-private``), ``GET /device-records/{id}`` never shows them. ``POST
/device-records[?dry_run=true]`` takes a JSON array of such objects (at most
``--max-body-bytes``) and applies them in one transaction, answering ``{"results": [{"id",
"outcome": created|updated|unchanged|stale|rejected, "reason"}]}`` in order; it needs write
scopes for both kinds (and for ``os`` when an item carries one). ``GET
/device-records?notices=true`` adds one line per lifecycle notice after the instances,
``{"notice": {...}}`` (``imds export`` asks for them; a ``notice`` read scope is needed then),
and ``POST /device-records`` takes such objects too (a ``notice`` write scope is needed then),
putting each notice back as it was.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from imds.errors import InvalidInput
from imds.models import NOTICE_KIND, OS_KIND, Instance
from imds.services import Services
from imds.services.admission.auth import read_scopes, upsert_scopes
from imds.services.records.wire import parse_instance_id, parse_json
from imds.services.render.json import encode
from imds.services.transfer.bulk import Item, parse_item, rejected
from imds.services.transfer.readout import to_wire
from imds.web.admin.auth import ID_EXTRA, authorize
from imds.web.body import read_limited
from imds.web.errors import JSON, documented

NDJSON = "application/x-ndjson"


def records_admin_router(services: Services) -> APIRouter:
    """``/device-records`` and ``/device-records/{id}``, bound to ``services``."""
    router = APIRouter(tags=["admin"], responses=documented(400, 401, 403, 404, 413, 503))

    @router.get("/device-records", summary="Every instance record, as JSON lines in the upsert format",
                response_class=StreamingResponse)
    async def list_records(request: Request, private: bool = True, notices: bool = False) -> StreamingResponse:
        wire = await _records_out(services, request, private=private, notices=notices)  # errors before streaming

        def lines() -> Iterator[bytes]:
            for record in wire:
                yield json.dumps(record, separators=(",", ":")).encode() + b"\n"

        return StreamingResponse(lines(), media_type=NDJSON)

    @router.post("/device-records", summary="Create or replace many records in one transaction (imds import)")
    async def post_records(request: Request, dry_run: bool = False) -> Response:
        subject = await authorize(services, request)
        objects = parse_json(await read_limited(request, services.settings.limits.max_body_bytes))
        if not isinstance(objects, list):
            raise InvalidInput.one("body", "must be a JSON array of upsert objects")
        items, results = [], {}
        for index, obj in enumerate(objects):
            label = f"item {index}"
            try:
                items.append((index, parse_item(obj, label=label, limits=services.limits,
                                                max_os_value_bytes=services.settings.ganeti.os_param_max_bytes)))
            except InvalidInput as exc:
                results[index] = rejected(label, obj, exc)
        await _authorize_os_writes(services, request, [item for _, item in items])
        written = await services.transfer.upsert([item for _, item in items], subject=subject, dry_run=dry_run)
        results.update({index: result for (index, _), result in zip(items, written, strict=True)})
        body = [{"id": r.id, "outcome": r.outcome, "reason": r.reason,
                 **({"warnings": list(r.warnings)} if r.warnings else {})} for _, r in sorted(results.items())]
        return Response(encode({"results": body}), media_type=JSON)

    @router.get("/device-records/{instance_id}", summary="One instance record in the upsert format",
                openapi_extra=ID_EXTRA)
    async def get_record(request: Request, instance_id: str) -> Response:
        instance = await services.transfer.get(parse_instance_id(instance_id))
        await _authorize_os_reads(services, request, [instance])
        return Response(encode(to_wire(instance, private=False)), media_type=JSON)

    return router


async def _authorize_os_reads(services: Services, request: Request, instances: list[Instance]) -> None:
    """Records that carry a Ganeti OS record go out only to a token with an ``os`` read scope too."""
    if any(instance.os is not None for instance in instances):
        await authorize(services, request, read_scopes(OS_KIND))


async def _authorize_os_writes(services: Services, request: Request, items: list[Item]) -> None:
    """Items that carry a Ganeti OS record need an ``os`` write scope too; notice items a ``notice`` one."""
    if any(item.os is not None for item in items):
        await authorize(services, request, upsert_scopes(OS_KIND))
    if any(item.notice is not None for item in items):
        await authorize(services, request, upsert_scopes(NOTICE_KIND))


async def _records_out(services: Services, request: Request, *, private: bool, notices: bool) -> list[dict[str, Any]]:
    """Every instance in the upsert format, then (``notices``) every notice as ``imds export`` writes it."""
    instances = await services.transfer.all()
    await _authorize_os_reads(services, request, instances)
    wire = [to_wire(instance, services.os.cipher, private=private) for instance in instances]
    if notices:  # a token with a notice read scope only
        await authorize(services, request, read_scopes(NOTICE_KIND))
        wire += await services.transfer.all_notices()
    return wire
