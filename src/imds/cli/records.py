"""``imds get / list / delete``: instance records from the database (``--db`` / ``--data-dir``) or a server (``--url``).

Directly on the database, as ``imds db`` and ``imds configdrive`` do (through
``imds.services.offline``; deletes take the admin API's write path and reach a running
server through its change feed), or against a live server's admin API with ``--url`` and
a token (``--token`` or ``IMDS_ADMIN_TOKEN``). ``--output json`` prints the upsert wire
format (``imds.services.transfer.readout``); ``table`` is for people.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, Self, TypeVar

import click

from imds import log
from imds.cli.options import resolve, settings_options
from imds.cli.remote import AdminClient
from imds.errors import ConfigError, ImdsError, InvalidInput
from imds.models import METADATA, USERDATA
from imds.services.offline import OfflineRecords, offline_records
from imds.services.records.wire import parse_instance_id
from imds.services.transfer.readout import summary, to_wire

T = TypeVar("T")
SUBJECT = "imds-cli"  # logged as the subject of CLI deletes and imports on the database
_DB_OPTIONS = ("data_dir", "db", "admin_token", "log_level", "private_key_file")
OUTPUTS = click.Choice(["table", "json"])


def target_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--db`` / ``--data-dir`` (database) or ``--url`` + ``--token`` (live server)."""
    command = click.option(
        "--token", default=None, help="Admin bearer token for --url (default: IMDS_ADMIN_TOKEN; flags show in ps).",
    )(command)
    command = click.option(
        "--url", default=None, help="A running imds server's URL, e.g. http://127.0.0.1:8000 (default: the database).",
    )(command)
    with_db: Callable[..., Any] = settings_options(_DB_OPTIONS)(command)
    return with_db


class Target:
    """Where records are read and deleted: the database (``offline``) or a server (``remote``)."""

    def __init__(self, flags: dict[str, Any]) -> None:
        url, token = flags.pop("url"), flags.pop("token")
        settings = resolve(flags)
        log.configure(settings.logging.log_level)  # JSON lines on stderr (deletes are logged); stdout is the answer
        self.remote = AdminClient(url, token or settings.admin.admin_token) if url else None
        self.db_url = settings.store.db
        self.settings = settings
        self.private_key_file = settings.ganeti.private_key_file

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.remote is not None:
            self.remote.close()

    def migrate(self) -> None:
        """Migrate the database, as ``imds serve`` does at start-up (a new or empty one gets its tables).

        Not for ``--url`` or ``memory://``, nor with ``IMDS_MIGRATE=false``.
        """
        if self.remote is not None or not self.settings.store.migrate or self.db_url.startswith("memory://"):
            return
        from imds.services import schema  # noqa: PLC0415 - Alembic loads only when a database is used

        try:
            schema.upgrade(self.db_url, data_dir=self.settings.store.data_dir)
        except ImdsError as exc:
            raise click.ClickException(exc.message) from exc

    def offline(self, action: Callable[[OfflineRecords], Awaitable[T]]) -> T:
        """Run ``action`` on the database's records, with imds errors as one-line CLI errors."""

        async def run() -> T:
            async with offline_records(self.db_url, private_key_file=self.private_key_file) as records:
                return await action(records)

        try:
            return asyncio.run(run())
        except ConfigError as exc:
            raise click.UsageError(exc.message) from exc
        except ImdsError as exc:
            raise click.ClickException(exc.message) from exc


def instance_id_argument(value: str) -> str:
    """The canonical UUID, or a usage error."""
    try:
        return parse_instance_id(value, "INSTANCE_ID")
    except InvalidInput as exc:
        raise click.UsageError("; ".join(f"{p.field} {p.message}" for p in exc.problems)) from exc


def fetch_one(target: Target, instance_id: str) -> dict[str, Any]:
    """One instance in the wire format, from wherever ``target`` points."""
    if target.remote is not None:
        record: dict[str, Any] = target.remote.get_json(f"/device-records/{instance_id}")
        return record

    async def read(records: OfflineRecords) -> dict[str, Any]:
        return to_wire(await records.get(instance_id), private=False)

    return target.offline(read)


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in [header, *rows]]
    return "\n".join(lines)


def _record_table(record: dict[str, Any]) -> str:
    facts = summary(record)
    metadata = record.get("metadata")
    rows = [
        ["id", record["id"]],
        ["addresses", ", ".join(record.get("ipAddresses", [])) or "-"],
        ["hostname", facts["hostname"] or "-"],
        ["metadata", f"{len(metadata)} keys: {', '.join(sorted(metadata))}" if isinstance(metadata, dict) else "-"],
        ["userdata", "-" if facts["userdata_bytes"] is None
         else f"{facts['userdata_bytes']} bytes ({record.get('userdata_encoding', 'text')})"],
    ]
    return _table(rows, ["field", "value"])


@click.command()
@click.argument("instance_id")
@target_options
@click.option("-o", "--output", type=OUTPUTS, default="table", show_default=True,
              help="table, or json (the upsert wire format, as imds export writes it).")
def get(instance_id: str, output: str, **flags: Any) -> None:
    """Show one instance: addresses, metadata and userdata."""
    with Target(flags) as target:
        record = fetch_one(target, instance_id_argument(instance_id))
    click.echo(json.dumps(record, indent=2, sort_keys=True) if output == "json" else _record_table(record))


@click.command(name="list")
@target_options
@click.option("-o", "--output", type=OUTPUTS, default="table", show_default=True,
              help="table, or json (a list of {id, hostname, ipAddresses, metadata, userdata_bytes}).")
def list_(output: str, **flags: Any) -> None:
    """List every stored instance: id, hostname, addresses and which records it has."""

    async def read(records: OfflineRecords) -> list[dict[str, Any]]:
        return [summary(to_wire(instance, private=False)) for instance in await records.all()]

    with Target(flags) as target:
        if target.remote is not None:
            rows = [summary(record) for record in target.remote.lines("/device-records")]
        else:
            rows = target.offline(read)
    if output == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    cells = [[row["id"], row["hostname"] or "-", ",".join(row["ipAddresses"]) or "-",
              "yes" if row["metadata"] else "-", "-" if row["userdata_bytes"] is None else str(row["userdata_bytes"])]
             for row in rows]
    click.echo(_table(cells, ["ID", "HOSTNAME", "ADDRESSES", "METADATA", "USERDATA"]))
    click.echo(f"{len(rows)} instance{'s' if len(rows) != 1 else ''}", err=True)


@click.command()
@click.argument("instance_id")
@target_options
@click.option("--kind", type=click.Choice(["all", METADATA, USERDATA]), default="all", show_default=True,
              help="Which record type to delete; all removes the instance and its addresses.")
@click.option("-o", "--output", type=OUTPUTS, default="table", show_default=True, help="table, or json.")
def delete(instance_id: str, kind: str, output: str, **flags: Any) -> None:
    """Delete an instance's records (as DELETE /device-metadata|userdata/ID does)."""
    instance_id = instance_id_argument(instance_id)

    async def remove(records: OfflineRecords) -> None:
        for each in kinds:
            await records.delete(each, instance_id, subject=SUBJECT)

    with Target(flags) as target:
        record = fetch_one(target, instance_id)
        kinds = [k for k in (METADATA, USERDATA) if k in record and kind in ("all", k)]
        if not kinds:
            raise click.ClickException(f"instance {instance_id} has no {kind} record")
        if target.remote is not None:
            for each in kinds:
                target.remote.send_json("DELETE", f"/device-{each}/{instance_id}")
        else:
            target.offline(remove)
    if output == "json":
        click.echo(json.dumps({"id": instance_id, "deleted": kinds}))
    else:
        click.echo(f"deleted {' and '.join(kinds)} of {instance_id}")
