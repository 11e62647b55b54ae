"""``/ui``: the admin web page (plain HTML + vanilla JS from the package; no build step, no CDN).

The page and its assets are public and hold nothing secret; every call the page makes goes
to the admin API with the bearer token the operator types in (kept in the tab's
``sessionStorage``). Two small read endpoints serve it:

- ``GET /device-search?q=`` (read scopes): instances by id prefix, hostname or IP (every
  entry containing it, longest prefix first), as ``{"instances": [summary…]}``;
- ``GET /device-changes?limit=`` (read scopes): the recent change feed, newest first.

The record view uses ``GET /explain/{id}`` (flavor previews) and ``GET /device-records/{id}``;
the event stream uses ``GET /device-events/{id}`` (the channel).
"""

from __future__ import annotations

from importlib import resources
from typing import Annotated

from fastapi import APIRouter, Query
from starlette.responses import HTMLResponse, Response

from imds.errors import NotFound
from imds.services import Services
from imds.services.render.json import encode
from imds.web.errors import JSON, documented

UI_URL = "/ui"
ASSETS = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
_STATIC = resources.files("imds.web").joinpath("static", "ui")
_SECURITY = {
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self'; object-src 'none'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def ui_router(services: Services) -> APIRouter:
    """The page, its assets, and the search and change-feed endpoints it reads."""
    router = APIRouter(tags=["admin"], responses=documented(400, 401, 403, 503))

    @router.get(UI_URL, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(_STATIC.joinpath("index.html").read_text(encoding="utf-8"), headers=_SECURITY)

    @router.get(UI_URL + "/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        media_type = ASSETS.get(name)
        if media_type is None:
            raise NotFound(f"no admin page asset {name!r}")
        return Response(_STATIC.joinpath(name).read_bytes(), media_type=media_type, headers=_SECURITY)

    @router.get("/device-search", summary="Instances by id prefix, hostname or IP (the admin page's search)")
    async def device_search(q: Annotated[str, Query(max_length=200)] = "") -> Response:
        return Response(encode({"instances": services.fleet.search(q)}), media_type=JSON)

    @router.get("/device-changes", summary="The recent change feed, newest first")
    async def device_changes(limit: Annotated[int, Query(ge=1, le=500)] = 50) -> Response:
        changes = await services.fleet.recent_changes(limit=limit)
        return Response(encode({"position": services.catalog.position, "changes": changes}), media_type=JSON)

    return router
