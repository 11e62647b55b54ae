"""``imds export``: every instance in the upsert wire format ``imds import`` reads, from the database or a server.

Formats: JSON lines (default), one JSON array, or a directory of ``<id>.json`` files. What
is written may hold private Ganeti OS values (decrypted with ``--private-key-file`` unless
``--no-private``), and the lifecycle notices unless ``--no-notices``: files are created 0600
(a directory made here 0700) and appear whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import click

from imds.cli.records import Target, target_options


@click.command()
@click.argument("destination", default="-", type=click.Path(allow_dash=True, path_type=str))
@target_options
@click.option("--format", "fmt", type=click.Choice(["jsonl", "json", "dir"]), default="jsonl", show_default=True,
              help="jsonl: one instance per line; json: one array; dir: DESTINATION/<id>.json per instance.")
@click.option("--no-private", is_flag=True,
              help="Leave private Ganeti OS parameter values out (secret ones are never exported).")
@click.option("--no-notices", is_flag=True, help="Leave the lifecycle notices out.")
def export(destination: str, fmt: str, no_private: bool, no_notices: bool, **flags: Any) -> None:
    """Write every instance to DESTINATION (default: stdout) in the upsert format imds import reads.

    An instance's Ganeti OS record is exported with it ("os"), private values decrypted
    with --private-key-file unless --no-private. The lifecycle notices follow the instances,
    one {"notice": {...}} each (current and history, with the guests' acknowledgements),
    unless --no-notices.
    """
    if fmt == "dir" and destination == "-":
        raise click.UsageError("--format dir needs a DESTINATION directory")
    with Target(flags) as target:
        if target.remote is not None:
            query = f"?private={str(not no_private).lower()}&notices={str(not no_notices).lower()}"
            records: Iterator[dict[str, Any]] = target.remote.lines(f"/device-records{query}")
            count = _write(records, destination, fmt)
        else:
            from imds.services.transfer.readout import to_wire  # noqa: PLC0415

            async def read(offline: Any) -> list[Any]:
                cipher = offline.os.cipher
                wire = [to_wire(instance, cipher, private=not no_private) for instance in await offline.all()]
                return wire if no_notices else wire + await offline.all_notices()

            count = _write(iter(target.offline(read)), destination, fmt)
    instances, notices = count
    shown = f"exported {instances} instance{'s' if instances != 1 else ''}"
    click.echo(shown + (f" and {notices} notice{'s' if notices != 1 else ''}" if notices else ""), err=True)


def _write(records: Iterator[dict[str, Any]], destination: str, fmt: str) -> tuple[int, int]:
    """Stream ``records`` out as ``fmt``; how many instances and notices were written.

    What is written may hold private values: files are created 0600 (a ``dir`` folder
    made here 0700) from the start, and a file appears whole or not at all.
    """
    count = 0
    notices = 0
    if fmt == "dir":
        folder = Path(destination)
        if not folder.exists():
            folder.mkdir(mode=0o700, parents=True)
        for record in records:
            name = record["id"] if "id" in record else f"notice-{record['notice']['id']}"
            with _private_file(folder / f"{name}.json") as out:
                out.write(json.dumps(record, indent=2, sort_keys=True) + "\n")
            count += 1
            notices += "notice" in record
        return count - notices, notices
    stdout: contextlib.AbstractContextManager[TextIO] = contextlib.nullcontext(sys.stdout)
    with stdout if destination == "-" else _private_file(Path(destination)) as out:
        if fmt == "json":
            out.write("[")
        for record in records:
            line = json.dumps(record, separators=(",", ":"), sort_keys=True)
            out.write((("," if count else "") + "\n" + line) if fmt == "json" else line + "\n")
            count += 1
            notices += "notice" in record
        if fmt == "json":
            out.write("\n]\n")
    return count - notices, notices


@contextlib.contextmanager
def _private_file(path: Path) -> Iterator[TextIO]:
    """A text file written under a temporary name (mode 0600 from the start), renamed into place when complete."""
    fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            yield out
        Path(scratch).replace(path)
    except BaseException:
        Path(scratch).unlink(missing_ok=True)
        raise
