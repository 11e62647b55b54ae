"""The database schema: Alembic migrations of the store at a URL (``imds db …``, ``imds serve --migrate``).

Alembic loads only when one of these runs, so ``imds --help`` stays quick.
"""

from __future__ import annotations

from pathlib import Path


def upgrade(url: str, revision: str = "head", *, data_dir: Path | None = None) -> None:
    """Apply migrations up to ``revision`` (creates an SQLite file if needed).

    ``data_dir`` (``imds serve``, ``imds import``): a new SQLite file goes in an existing directory
    or that one; without it (``imds db upgrade``), its missing directories are made too.
    """
    from imds.store.sql import migrate  # noqa: PLC0415 - Alembic loads only when migrating

    migrate.upgrade(url, revision, data_dir=data_dir)


def current(url: str) -> str:
    """The revision the database is at."""
    from imds.store.sql import migrate  # noqa: PLC0415 - Alembic loads only when migrating

    return migrate.current(url)


def check(url: str) -> None:
    """Raise ConfigError when the tables in code and the migrations disagree."""
    from imds.store.sql import migrate  # noqa: PLC0415 - Alembic loads only when migrating

    migrate.check(url)
