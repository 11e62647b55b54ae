"""``GET /explain?q=IP|ID`` and ``GET /explain/{id}``: why an address gets an instance (``imds explain``).

Read scopes for metadata and userdata (previews show both; ``imds.web.admin.scopes``), and
for ``os`` when the instance shown has a Ganeti OS record (its preview shows the public
parameters). The body is ``imds.services.explain``'s explanation; private and secret values
are masked.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from imds.models import OS_KIND, Instance
from imds.services import Services
from imds.services.admission.auth import read_scopes
from imds.services.explain import explain_address, explain_instance, parse_query
from imds.services.records.readout import InstanceNotStored
from imds.services.render.json import encode
from imds.web.admin.auth import ID_PARAM, authorize
from imds.web.errors import JSON, documented


def explain_router(services: Services) -> APIRouter:
    """``/explain``, bound to ``services``."""
    router = APIRouter(tags=["admin"], responses=documented(400, 401, 403, 404, 503))

    async def explained(request: Request, query: str) -> bytes:
        found = await explanation(query)
        shown = found.get("instance")
        if isinstance(shown, dict) and shown.get("os"):
            await authorize(services, request, read_scopes(OS_KIND))
        return encode(found)

    async def explanation(query: str) -> dict[str, Any]:
        parsed = parse_query(query)
        lookup = services.lookup
        if isinstance(parsed, str):
            found = await services.store.get(parsed)  # the addresses as sent (the index holds networks)
            entry = services.catalog.get(parsed)
            if found is None and entry is None:
                raise InstanceNotStored(parsed)
            upstream = lookup.provenance(None, parsed) if lookup is not None else None
            return explain_instance(found or entry.instance,  # type: ignore[union-attr]
                                    templates=services.templates, upstream=upstream or {"configured": False})
        entries = services.catalog.containing(parsed)
        holder = entries[0][1] if entries else None
        upstream = lookup.provenance(parsed, holder) if lookup is not None else {"configured": False}
        stored = await services.store.get_many({held_by for _, held_by in entries})

        def instance(instance_id: str) -> Instance | None:
            if instance_id in stored:
                return stored[instance_id]
            entry = services.catalog.get(instance_id)
            return entry.instance if entry is not None else None

        return explain_address(parsed, entries, instance, templates=services.templates, upstream=upstream)

    @router.get("/explain", summary="Which instance an address (or id) resolves to, through which entry")
    async def explain_query(request: Request, q: str) -> Response:
        return Response(await explained(request, q), media_type=JSON)

    @router.get("/explain/{instance_id}", summary="An instance's entries and what each flavor serves it",
                openapi_extra={"parameters": [ID_PARAM]})
    async def explain_id(request: Request, instance_id: str) -> Response:
        return Response(await explained(request, instance_id), media_type=JSON)

    return router
