"""``imds db upgrade|current|check``: Alembic migrations of the configured database."""

from __future__ import annotations

from typing import Any

import click

from imds.cli.options import resolve, settings_options
from imds.errors import ImdsError

_DB_OPTIONS = ("data_dir", "db")


def _url(flags: dict[str, Any]) -> str:
    settings = resolve(flags)
    if settings.store.db.startswith("memory://"):
        raise click.UsageError("memory:// has no schema to migrate")
    return settings.store.db


@click.group()
def db() -> None:
    """Database schema migrations."""


@db.command()
@settings_options(_DB_OPTIONS)
@click.option("--revision", default="head", show_default=True, help="Target revision.")
def upgrade(revision: str, **flags: Any) -> None:
    """Apply migrations up to REVISION (creates an SQLite file, and its directories, if needed)."""
    from imds.services import schema  # noqa: PLC0415 - Alembic loads only for db commands

    try:
        schema.upgrade(_url(flags), revision)
    except ImdsError as exc:
        raise click.ClickException(exc.message) from exc
    click.echo(f"database upgraded to {revision}")


@db.command()
@settings_options(_DB_OPTIONS)
def current(**flags: Any) -> None:
    """Print the revision the database is at."""
    from imds.services import schema  # noqa: PLC0415 - Alembic loads only for db commands

    try:
        click.echo(schema.current(_url(flags)))
    except ImdsError as exc:
        raise click.ClickException(exc.message) from exc


@db.command()
@settings_options(_DB_OPTIONS)
def check(**flags: Any) -> None:
    """Fail when the tables in code and the migrations disagree (the database must be at head)."""
    from imds.services import schema  # noqa: PLC0415 - Alembic loads only for db commands

    try:
        schema.check(_url(flags))
    except ImdsError as exc:
        raise click.ClickException(exc.message) from exc
    click.echo("schema matches migrations")
