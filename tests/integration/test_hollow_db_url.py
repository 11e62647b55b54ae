"""A hollow database URL (``METADATASERVICE_CRDB_URI``, with ``?sslmode=``) opens the PostgreSQL store as it is."""

from __future__ import annotations

import asyncio

import asyncpg  # type: ignore[import-untyped]  # asyncpg ships no type information
import pytest
import sqlalchemy as sa

from imds.config import load
from imds.store.sql.engine import create_engine
from imds.store.sql.listen import plain_dsn


@pytest.mark.postgres
def test_hollow_crdb_uri_with_sslmode_connects(postgres_server) -> None:
    """The engine and the feed listener both connect with hollow's quickstart-style URL (sslmode=disable)."""
    url = load(environ={"METADATASERVICE_CRDB_URI": postgres_server.url() + "?sslmode=disable"}).store.db
    assert url.endswith("?sslmode=disable")

    async def run() -> tuple[int, int]:
        engine = create_engine(url)
        try:
            async with engine.connect() as conn:
                through_engine = (await conn.execute(sa.text("SELECT 1"))).scalar_one()
        finally:
            await engine.dispose()
        listener = await asyncpg.connect(plain_dsn(url))
        try:
            return through_engine, await listener.fetchval("SELECT 2")
        finally:
            await listener.close()

    assert asyncio.run(run()) == (1, 2)
