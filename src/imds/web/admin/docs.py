"""``/docs``: Swagger UI for the admin API, with its assets served by imds itself (no CDN).

The JavaScript and CSS are Swagger UI 5's release files (Apache-2.0), as shipped by the
``fastapi-offline`` package, so the page works on a host with no internet access. Swagger UI 5
is needed: FastAPI describes the API in OpenAPI 3.1, which Swagger UI 4 renders as a blank page.

The page itself holds nothing secret and is public; ``/openapi.json`` needs a token with the
``read`` or ``metrics`` scope, so the page has a token field (no browser prompt: the page
renders without one, headless browsers included). The token is kept in the tab's
``sessionStorage`` (under the key ``/ui`` uses, so one typed there serves here too) and sent
as a bearer header on the spec fetch and every request Swagger UI makes, never in a URL. The
spec is fetched only with a token; a refused one is said next to the field (with the status),
not shown as a page of 401s.
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
<html><head><meta charset="utf-8"><title>{title} - Swagger UI</title>
<link type="text/css" rel="stylesheet" href="{assets}/swagger-ui.css">
<link rel="shortcut icon" href="{assets}/favicon.png">
<style>
#imds-token { font-family: sans-serif; margin: 1em 20px; display: flex; gap: .5em; align-items: center; }
#imds-token-state { color: #555; }
</style></head>
<body>
<form id="imds-token" autocomplete="off">
  <label for="imds-token-value">Admin token (read or metrics scope)</label>
  <input id="imds-token-value" type="password" placeholder="bearer token (kept in this tab only)">
  <button id="imds-token-use" type="submit">Use token</button>
  <button id="imds-token-forget" type="button">Forget</button>
  <span id="imds-token-state" role="status"></span>
</form>
<div id="swagger-ui"></div>
<script src="{assets}/swagger-ui-bundle.js"></script>
<script>
const key = "imds-admin-token";  // the admin page's (/ui) key: one token per tab for both
const state = document.getElementById("imds-token-state");
const token = () => sessionStorage.getItem(key) || "";

async function show() {
  const current = token();
  document.getElementById("swagger-ui").replaceChildren();
  if (!current) {
    state.textContent = "enter an admin token to load the API description";
    return;
  }
  state.textContent = "loading the API description…";
  let response;
  try {
    response = await fetch({openapi_url}, {headers: {"Authorization": "Bearer " + current}, cache: "no-store"});
  } catch (error) {
    state.textContent = "cannot load the API description: " + error;
    return;
  }
  if (!response.ok) {
    state.textContent = "the token was refused (" + response.status + "): enter another";
    return;
  }
  state.textContent = "token set for this tab";
  window.ui = SwaggerUIBundle({
    spec: await response.json(),
    dom_id: "#swagger-ui",
    requestInterceptor: (request) => {
      if (token()) { request.headers["Authorization"] = "Bearer " + token(); }
      return request;
    },
  });
}

document.getElementById("imds-token").addEventListener("submit", (event) => {
  event.preventDefault();
  const field = document.getElementById("imds-token-value");
  sessionStorage.setItem(key, field.value.trim());
  field.value = "";
  show();
});
document.getElementById("imds-token-forget").addEventListener("click", () => {
  sessionStorage.removeItem(key);
  show();
});
show();
</script></body></html>
"""
