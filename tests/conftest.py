"""Shared fixtures. Database servers the tests need are started by the tests themselves.

Store kinds: a test (or a fixture it uses) that asks for ``db_url`` or ``store`` runs once per
store kind (memory://, a migrated SQLite file, a migrated PostgreSQL database). A module, class
or test narrows the kinds with the ``stores`` marker, e.g. ``pytest.mark.stores("memory", "sqlite")``
(the two that need no server).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from imds.store import Store, open_store

pytest_plugins = ["postgres_server", "chromium"]

EVERY_STORE = ("memory", "sqlite", "postgres")


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``stores`` marker (the store kinds a test runs on)."""
    config.addinivalue_line("markers", "stores(*kinds): run on these store kinds only (memory, sqlite, postgres)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One run per store kind for every test that needs ``store_kind`` (through ``db_url`` or ``store``)."""
    if "store_kind" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("stores")
    kinds = marker.args if marker else EVERY_STORE
    params = [pytest.param(kind, marks=pytest.mark.postgres) if kind == "postgres" else kind for kind in kinds]
    metafunc.parametrize("store_kind", params, indirect=True)


@pytest.fixture
def store_kind(request: pytest.FixtureRequest) -> str:
    """memory, sqlite or postgres: parametrised by ``pytest_generate_tests`` (see the module docstring)."""
    kind: str = request.param
    return kind


@pytest.fixture
def db_url(store_kind: str, request: pytest.FixtureRequest) -> str:
    """The URL of an empty store of ``store_kind``: memory://, a migrated SQLite file or PostgreSQL database."""
    if store_kind == "memory":
        return "memory://"
    return str(request.getfixturevalue(f"{store_kind}_url"))


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    """An empty store of each kind, closed after the test."""
    opened = open_store(db_url)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio (the loop imds serve runs on)."""
    return "asyncio"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A migrated SQLite database in a temporary directory."""
    from imds.store.sql import migrate  # noqa: PLC0415 - Alembic loads only for tests that use SQLite

    url = f"sqlite:///{tmp_path / 'imds.db'}"
    migrate.upgrade(url)
    return url
