"""``imds configdrive build``: an instance's config drive (or NoCloud seed) ISO from the configured store."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from imds.cli.options import resolve, settings_options
from imds.errors import ImdsError, InvalidInput

if TYPE_CHECKING:
    from imds.services.drives import Drive

_DB_OPTIONS = ("data_dir", "db")


async def _build(url: str, instance_id: str, fmt: str) -> Drive:
    """The drive of the instance, which must have metadata (RecordNotFound otherwise), read from the database."""
    from imds.services.drives import build_drive, drive_format  # noqa: PLC0415 - pycdlib loads only when used
    from imds.services.offline import offline_records  # noqa: PLC0415 - the store loads only when a command runs

    async with offline_records(url) as offline:
        return await build_drive(offline.records, instance_id, drive_format(fmt, "--format"))


def _write_atomically(path: Path, data: bytes) -> None:
    """Write to a temporary file beside ``path`` and rename it over, so no half-written ISO is left."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        Path(temporary).replace(path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


@click.group()
def configdrive() -> None:
    """Config drives (ISO 9660) built from the stored records."""


@configdrive.command()
@settings_options(_DB_OPTIONS)
@click.option("--instance", "instance_id", required=True, help="Instance id (UUID).")
@click.option(
    "-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path), help="ISO file to write.",
)
@click.option(
    "--format", "fmt", type=click.Choice(["config-2", "nocloud"]), default="config-2", show_default=True,
    help="config-2: OpenStack config drive (openstack/…, ec2/…); nocloud: cloud-init NoCloud seed (label cidata).",
)
def build(instance_id: str, output: Path, fmt: str, **flags: Any) -> None:
    """Write the instance's config drive ISO (ISO 9660 + Joliet + Rock Ridge)."""
    from imds.services.records.wire import parse_instance_id  # noqa: PLC0415

    settings = resolve(flags)
    try:
        drive = asyncio.run(_build(settings.store.db, parse_instance_id(instance_id, "--instance"), fmt))
    except InvalidInput as exc:
        raise click.UsageError("; ".join(f"{p.field} {p.message}" for p in exc.problems)) from exc
    except ImdsError as exc:
        raise click.ClickException(exc.message) from exc
    try:
        _write_atomically(output, drive.data)
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror}") from exc
    click.echo(f"wrote {output} ({drive.fmt}, label {drive.label}, {len(drive.data)} bytes)")


@configdrive.command(name="list")
@click.argument("image", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def list_(image: Path) -> None:
    """Print an ISO's volume label, then each file (Rock Ridge path) with its size in bytes."""
    from pycdlib.pycdlibexception import PyCdlibException  # noqa: PLC0415 - pycdlib loads only when used

    from imds.configdrive import list_iso  # noqa: PLC0415

    try:
        with image.open("rb") as data:
            label, files = list_iso(data)
    except (PyCdlibException, OSError) as exc:
        raise click.ClickException(f"{image}: not a readable ISO 9660 image ({exc})") from exc
    click.echo(f"label {label}")
    for path, size in files:
        click.echo(f"{size:>10}  {path}")
