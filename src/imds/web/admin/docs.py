"""``/docs``: Swagger UI for the admin API, with its assets served by imds itself (no CDN).

The JavaScript and CSS are Swagger UI 5's release files (Apache-2.0), as shipped by the
``fastapi-offline`` package, so the page works on a host with no internet access. Swagger UI 5
is needed: FastAPI describes the API in OpenAPI 3.1, which Swagger UI 4 renders as a blank page.

The page itself holds nothing secret and is public; ``/openapi.json`` needs a token with the
``read`` or ``metrics`` scope, so the page asks for one, keeps it in the tab's
``sessionStorage`` and sends it as a bearer header on every request Swagger UI makes (the
spec fetch included), never in a URL.
"""

from __future__ import annotations

import html
import json
from importlib.resources import files

from fastapi import APIRouter
from starlette.responses import HTMLResponse, Response

from imds.errors import NotFound

DOCS_URL = "/docs"
ASSETS_URL = f"{DOCS_URL}/assets"
# fastapi-offline's static files (Swagger UI 5); nothing else of that package is used.
BUNDLE = files("fastapi_offline") / "static"
# The only files served, with their media types: nothing else under the bundle is reachable.
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon.png": "image/png",
}


def docs_router(*, title: str, openapi_url: str) -> APIRouter:
    """``/docs`` and ``/docs/assets/{name}``; give FastAPI ``docs_url=None`` so this one answers."""
    router = APIRouter(include_in_schema=False)

    page = _PAGE.replace("{title}", html.escape(title)).replace("{assets}", ASSETS_URL)
    page = page.replace("{openapi_url}", json.dumps(openapi_url))

    @router.get(DOCS_URL)
    async def docs() -> HTMLResponse:
        return HTMLResponse(page)

    @router.get(ASSETS_URL + "/{name}")
    async def asset(name: str) -> Response:
        media_type = ASSETS.get(name)
        if media_type is None:
            raise NotFound(f"no documentation asset {name!r}")
        content = (BUNDLE / name).read_bytes()
        return Response(content, media_type=media_type, headers={"cache-control": "public, max-age=86400"})

    return router


_PAGE = """<!doctype html>
<html><head><title>{title} - Swagger UI</title>
<link type="text/css" rel="stylesheet" href="{assets}/swagger-ui.css">
<link rel="shortcut icon" href="{assets}/favicon.png"></head>
<body><div id="swagger-ui"></div>
<script src="{assets}/swagger-ui-bundle.js"></script>
<script>
const key = "imds-admin-token";
let token = sessionStorage.getItem(key);
if (!token) {
  token = window.prompt("Admin token (read or metrics scope) for the API description:") || "";
  sessionStorage.setItem(key, token);
}
window.ui = SwaggerUIBundle({
  url: {openapi_url},
  dom_id: "#swagger-ui",
  requestInterceptor: (request) => {
    if (token) { request.headers["Authorization"] = "Bearer " + token; }
    return request;
  },
});
</script></body></html>
"""
