"""``/docs`` works on an air-gapped host: every asset the page names is served by imds itself."""

from __future__ import annotations

import re

import pytest

from helpers import client_from, running_app

pytestmark = pytest.mark.anyio

EXPECTED_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}


async def test_docs_page_references_only_local_assets_that_answer():
    """Every src/href in /docs is a local path, and each answers 200 with the right type and real content."""
    async with running_app() as app, client_from(app) as client:
        page = await client.get("/docs")
        assert page.status_code == 200
        assert "text/html" in page.headers["content-type"]
        urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
        assert urls, page.text
        assert '"/openapi.json"' in page.text
        # The spec needs a token: the page sends one as a bearer header, never in a URL.
        assert 'request.headers["Authorization"] = "Bearer " + token' in page.text
        assert "?token" not in page.text
        assert not [u for u in urls if "://" in u or u.startswith("//")], urls
        assert "cdn" not in page.text.lower()
        assert {u.rsplit("/", 1)[1] for u in urls} == {"swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png"}
        for url in urls:
            response = await client.get(url)
            assert response.status_code == 200, url
            suffix = url[url.rindex(".") :]
            assert response.headers["content-type"].startswith(EXPECTED_TYPES[suffix]), url
            assert len(response.content) > 500, url
        script = await client.get("/docs/assets/swagger-ui-bundle.js")
        assert b"SwaggerUIBundle" in script.content
        css = await client.get("/docs/assets/swagger-ui.css")
        assert b".swagger-ui" in css.content


async def test_only_the_listed_assets_are_served():
    """Other names (including paths out of the bundle) are 404, in the admin API's JSON error shape."""
    async with running_app() as app, client_from(app) as client:
        for name in ("index.html", "..%2F__init__.py", "swagger-ui.js.map"):
            response = await client.get(f"/docs/assets/{name}")
            assert response.status_code == 404, name
            assert "message" in response.json()
