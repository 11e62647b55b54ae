"""The request limits imds enforces itself (``imds.web.bounded``), whichever server runs it.

Driven in-process so the wrapper, not granian, is what refuses: the same checks then hold
under ``--server uvicorn``, whose parser lets more through.
"""

from __future__ import annotations

import httpx
import pytest

from helpers import ADMIN_TOKEN, make_settings, running_app
from imds.web.bounded import Bounded

pytestmark = pytest.mark.anyio
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _client(app: Bounded) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=("192.0.2.250", 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://imds.test", headers=AUTH)


async def test_more_headers_than_allowed_is_431_naming_the_flag():
    """--max-headers 20: a request with 30 header lines is refused before any handler runs."""
    settings = make_settings(max_headers=20)
    async with running_app(settings) as app, _client(Bounded(app, settings)) as client:
        answer = await client.get("/healthz", headers={f"x-n{i}": "1" for i in range(30)})
        assert answer.status_code == 431
        assert "--max-headers" in answer.json()["errors"][0]["message"]
        assert answer.headers["connection"] == "close"
        assert (await client.get("/healthz")).json() == {"status": "ok"}


async def test_a_declared_body_over_the_limit_is_413_before_reading_it():
    """Content-Length above --max-body-bytes answers 413 without waiting for the body."""
    settings = make_settings(max_body_bytes=100)
    async with running_app(settings) as app, _client(Bounded(app, settings)) as client:
        answer = await client.post("/device-metadata", content=b"x" * 101, headers={"content-type": "application/json"})
        assert answer.status_code == 413
        assert answer.json()["message"] == "request body too large"


async def test_content_length_with_transfer_encoding_is_400():
    """Both framings at once (the CL.TE smuggling shape) is refused, not guessed at."""
    settings = make_settings()
    async with running_app(settings) as app, _client(Bounded(app, settings)) as client:
        headers = {"transfer-encoding": "chunked", "content-type": "application/json"}
        answer = await client.post("/device-metadata", content=b"{}", headers=headers)  # httpx adds Content-Length
        assert answer.status_code == 400
        assert "ambiguous framing" in answer.json()["errors"][0]["message"]
