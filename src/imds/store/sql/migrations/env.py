"""Alembic environment: runs migrations over imds's own async engine."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from imds.store.sql.engine import create_engine
from imds.store.sql.tables import metadata_obj


def _do_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata_obj,
        render_as_batch=True,  # ALTERs on SQLite go through table copies
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    engine = create_engine(context.config.attributes["imds_url"])
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_do_run)
            await conn.commit()
    finally:
        await engine.dispose()


asyncio.run(_run_async())
