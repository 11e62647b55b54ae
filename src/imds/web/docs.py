"""``/docs``: Swagger UI for the admin API, with its assets served by imds itself (no CDN).

The JavaScript and CSS come from the ``swagger-ui-bundle`` package (Swagger UI's own
release files, Apache-2.0), so the page works on a host with no internet access.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.responses import HTMLResponse, Response
from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]  # ships no py.typed

from imds.errors import NotFound

DOCS_URL = "/docs"
ASSETS_URL = f"{DOCS_URL}/assets"
# The only files served, with their media types: nothing else under the bundle is reachable.
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon-32x32.png": "image/png",
}


def docs_router(*, title: str, openapi_url: str) -> APIRouter:
    """``/docs`` and ``/docs/assets/{name}``; give FastAPI ``docs_url=None`` so this one answers."""
    router = APIRouter(include_in_schema=False)

    @router.get(DOCS_URL)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title} - Swagger UI",
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_URL}/favicon-32x32.png",
        )

    @router.get(ASSETS_URL + "/{name}")
    async def asset(name: str) -> Response:
        media_type = ASSETS.get(name)
        if media_type is None:
            raise NotFound(f"no documentation asset {name!r}")
        content = (swagger_ui_path / name).read_bytes()
        return Response(content, media_type=media_type, headers={"cache-control": "public, max-age=86400"})

    return router
