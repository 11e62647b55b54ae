"""``GET /explain?q=IP|ID`` and ``GET /explain/{id}``: why an address gets an instance (``imds explain``).

Read scopes for metadata and userdata (previews show both; ``imds.web.admin.scopes``), and
for ``os`` when the instance shown has a Ganeti OS record (its preview shows the public
parameters). The body is ``imds.services.explain``'s explanation; private and secret values
are masked.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from imds.models import OS_KIND
from imds.services import Services
from imds.services.admission.auth import read_scopes
from imds.services.render.json import encode
from imds.web.admin.auth import ID_PARAM, authorize
from imds.web.errors import JSON, documented


def explain_router(services: Services) -> APIRouter:
    """``/explain``, bound to ``services``."""
    router = APIRouter(tags=["admin"], responses=documented(400, 401, 403, 404, 503))

    async def explained(request: Request, query: str) -> bytes:
        found = await services.explainer.explain(query)
        shown = found.get("instance")
        if isinstance(shown, dict) and shown.get("os"):
            await authorize(services, request, read_scopes(OS_KIND))
        return encode(found)

    @router.get("/explain", summary="Which instance an address (or id) resolves to, through which entry")
    async def explain_query(request: Request, q: str) -> Response:
        return Response(await explained(request, q), media_type=JSON)

    @router.get("/explain/{instance_id}", summary="An instance's entries and what each flavor serves it",
                openapi_extra={"parameters": [ID_PARAM]})
    async def explain_id(request: Request, instance_id: str) -> Response:
        return Response(await explained(request, instance_id), media_type=JSON)

    return router
