"""``/docs`` works on an air-gapped host: every asset the page names is served by imds itself.

And it shows the API: a headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
driven by selenium as in ``test_admin_page.py``) opens the page of a real ``imds serve`` and
reads the operations Swagger UI lists. FastAPI describes the API in OpenAPI 3.1, which
Swagger UI 4 rendered as an empty page.
"""

from __future__ import annotations

import re

import pytest

from chromium import WAIT
from helpers import client_from, running_app
from serve_process import ADMIN_TOKEN, serving

EXPECTED_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}


@pytest.mark.anyio
async def test_docs_page_references_only_local_assets_that_answer():
    """Every src/href in /docs is a local path, and each answers 200 with the right type and real content."""
    async with running_app() as app, client_from(app) as client:
        page = await client.get("/docs")
        assert page.status_code == 200
        assert "text/html" in page.headers["content-type"]
        urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
        assert urls, page.text
        assert '"/openapi.json"' in page.text
        # The spec needs a token: typed into the page's own field (no browser prompt), sent as a
        # bearer header on the spec fetch and Swagger UI's requests, never in a URL.
        assert '<input id="imds-token-value" type="password"' in page.text
        assert "prompt(" not in page.text
        assert '{"Authorization": "Bearer " + current}' in page.text
        assert 'request.headers["Authorization"] = "Bearer " + token()' in page.text
        assert "?token" not in page.text
        assert not [u for u in urls if "://" in u or u.startswith("//")], urls
        assert "cdn" not in page.text.lower()
        assert {u.rsplit("/", 1)[1] for u in urls} == {"swagger-ui-bundle.js", "swagger-ui.css", "favicon.png"}
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


@pytest.mark.anyio
async def test_only_the_listed_assets_are_served():
    """Other names (including paths out of the bundle) are 404, in the admin API's JSON error shape."""
    async with running_app() as app, client_from(app) as client:
        for name in ("index.html", "..%2F__init__.py", "swagger-ui.js.map"):
            response = await client.get(f"/docs/assets/{name}")
            assert response.status_code == 404, name
            assert "message" in response.json()


def test_docs_page_shows_the_api_in_a_browser(tmp_path, browser):
    """No prompt: a fresh tab renders the page and its token field; a wrong token is said there; a good one, the API.

    Swagger UI then renders the spec: its title, and the admin operations, ``/device-metadata`` among them.
    """
    from selenium.common.exceptions import NoAlertPresentException  # noqa: PLC0415
    from selenium.webdriver.common.by import By  # noqa: PLC0415
    from selenium.webdriver.support import expected_conditions as ec  # noqa: PLC0415
    from selenium.webdriver.support.ui import WebDriverWait  # noqa: PLC0415

    def use(value: str) -> None:
        field = browser.find_element(By.ID, "imds-token-value")
        field.clear()
        field.send_keys(value)
        browser.find_element(By.ID, "imds-token-use").click()

    with serving(tmp_path, "--demo") as server:
        browser.get(f"{server.url}/docs")  # a fresh profile: no token in this tab
        wait = WebDriverWait(browser, WAIT)
        state = (By.ID, "imds-token-state")
        wait.until(ec.text_to_be_present_in_element(state, "enter an admin token"))
        with pytest.raises(NoAlertPresentException):
            browser.switch_to.alert.text  # noqa: B018 - reading it is the check: no prompt was opened
        first = tmp_path / "docs-no-token.png"
        browser.save_screenshot(str(first))  # a prompt would block this (and every other command)
        assert browser.find_elements(By.CSS_SELECTOR, ".swagger-ui .opblock") == []
        assert browser.find_elements(By.CSS_SELECTOR, ".swagger-ui .errors-wrapper") == []

        use("not-the-token")
        wait.until(ec.text_to_be_present_in_element(state, "the token was refused (401)"))
        assert browser.find_elements(By.CSS_SELECTOR, ".swagger-ui .opblock") == []

        use(ADMIN_TOKEN)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".swagger-ui .opblock-summary-path")))
        paths = {element.text.replace("\u200b", "")
                 for element in browser.find_elements(By.CSS_SELECTOR, ".swagger-ui .opblock-summary-path")}
        title = browser.find_element(By.CSS_SELECTOR, ".swagger-ui .info .title").text
        errors = browser.find_elements(By.CSS_SELECTOR, ".swagger-ui .errors-wrapper")
        told = browser.find_element(*state).text
        shot = tmp_path / "docs.png"
        browser.save_screenshot(str(shot))
        print(f"screenshots: {first} {shot}")  # noqa: T201 - the paths, for a person looking at a failure
        browser.refresh()  # the token stays for this tab: the API shows again without typing it
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".swagger-ui .opblock-summary-path")))
    assert told == "token set for this tab"
    assert "/device-metadata" in paths, paths
    assert "/device-userdata/{instance_id}" in paths, paths
    assert "imds" in title.lower(), title
    assert errors == [], [e.text for e in errors]
