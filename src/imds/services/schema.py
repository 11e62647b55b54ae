"""The database schema: Alembic migrations of the store at a URL (``imds db …``, ``imds serve --migrate``).

Alembic loads only when one of these runs, so ``imds --help`` stays quick.
"""

from __future__ import annotations


def upgrade(url: str, revision: str = "head") -> None:
    """Apply migrations up to ``revision`` (creates an SQLite file if needed)."""
    from imds.store.sql import migrate  # noqa: PLC0415 - Alembic loads only when migrating

    migrate.upgrade(url, revision)


def current(url: str) -> str:
    """The revision the database is at."""
    from imds.store.sql import migrate  # noqa: PLC0415 - Alembic loads only when migrating

    return migrate.current(url)


def check(url: str) -> None:
    """Raise ConfigError when the tables in code and the migrations disagree."""
    from imds.store.sql import migrate  # noqa: PLC0415 - Alembic loads only when migrating

    migrate.check(url)
