"""Shared fixtures. Database servers the tests need are started by the tests themselves."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

pytest_plugins = ["postgres_server"]


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


@pytest.fixture(params=["memory", "sqlite"])
def local_store_url(request: pytest.FixtureRequest) -> str:
    """memory:// or a migrated SQLite file: the two stores that need no server."""
    return "memory://" if request.param == "memory" else request.getfixturevalue("sqlite_url")
