"""Building and driving the app in-process, with the caller's address as an explicit input."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from imds.app import build_app
from imds.config import Settings
from imds.store import Store
from imds.web.instance import InstanceFront

ADMIN_TOKEN = "test-admin-token"
ADMIN_PEER = "192.0.2.250"
FIXTURES = Path(__file__).parent / "fixtures"


def fixture_path(name: str) -> Path:
    """The reference file ``name`` from tests/fixtures (the design's examples, kept in the repository)."""
    path = FIXTURES / name
    assert path.is_file(), f"no test fixture {name!r} in {FIXTURES}"
    return path


def fixture_json(name: str) -> Any:
    """The JSON reference file ``name`` from tests/fixtures, parsed afresh on every call."""
    return json.loads(fixture_path(name).read_text())


def make_settings(**overrides: Any) -> Settings:
    """Settings for tests: in-memory store and a known admin token unless overridden."""
    values: dict[str, Any] = {"db": "memory://", "admin_token": ADMIN_TOKEN, "feed_poll_interval": 0.05}
    # In-process crawls send hundreds of requests from one address in well under a second;
    # the rate limit has its own tests (tests/security/test_http_abuse.py, services/test_ratelimit.py).
    values["rate_limit"] = 0.0
    values.update(overrides)
    return Settings.of(**values)


@asynccontextmanager
async def running_app(
    settings: Settings | None = None, *, store: Store | None = None
) -> AsyncIterator[InstanceFront]:
    """The app with its services started (the lifespan, without a server)."""
    app = build_app(settings or make_settings(), store=store)
    async with app.services.running():
        yield app


def client_from(
    app: InstanceFront, ip: str = ADMIN_PEER, *, token: str | None = None, **kwargs: Any
) -> httpx.AsyncClient:
    """An HTTP client whose requests reach ``app`` from source address ``ip``."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = httpx.ASGITransport(app=app, client=(ip, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://imds.test", headers=headers, **kwargs)


def admin_client(app: InstanceFront, token: str = ADMIN_TOKEN) -> httpx.AsyncClient:
    """A client carrying the test admin token."""
    return client_from(app, ADMIN_PEER, token=token)
