"""``imds import`` and ``imds export``: whole fleets in the upsert wire format, on the database or a server.

Input: JSON lines, a JSON array (read one element at a time), or a directory of per-instance
``*.json`` files, each object one instance (``id``, ``ipAddresses``, ``metadata`` and/or
``userdata``, as ``imds export`` writes and ``POST /device-metadata`` / ``/device-userdata``
take), held to the admin API's limits. The source is read twice: first to check that it can
be read at all (UTF-8, parseable: otherwise nothing is written) and to find ids given twice
(a warning naming both lines; ``--strict`` rejects the file), then to write. Items go in
batches, each one transaction (``imds.services.transfer.bulk``); an item that would change nothing
is ``unchanged`` and not written, so a re-run reports everything unchanged. Progress goes to
stderr (a bar on a terminal, a line every few seconds otherwise); the summary and every
rejected item (with its line and reason) go to stdout; warnings (an id twice, an address with
host bits set, a secret OS value an offline import cannot keep) to stderr.

``--from-hollow DSN`` reads a hollow-metadataservice database instead of SOURCE
(``imds.cli.hollow``): its ids are unique, so it is read once (twice with ``--strict``), and
its instance count is the total. On the database, a new or empty one is migrated before the
first write, as ``imds serve`` does at start-up (``IMDS_MIGRATE=false`` turns that off).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TextIO

import click

from imds.cli.options import settings_options
from imds.cli.progress import Progress
from imds.cli.records import SUBJECT, Target, target_options
from imds.config import OPTIONS
from imds.config.database import DatabaseUrlError, parse_source
from imds.errors import InvalidInput
from imds.services.records.limits import Limits
from imds.services.records.wire import NoteKind
from imds.services.transfer.bulk import OUTCOMES, Item, Result, item_notes, parse_item, rejected
from imds.services.transfer.source import Raw, UnreadableInput, read_path, read_stream

if TYPE_CHECKING:
    from imds.cli.hollow import HollowItems

BATCH_BYTES = 512 * 1024  # per POST /device-records, under the default --max-body-bytes (1 MiB)
SHOWN_NOTES = 20  # warning lines of one kind shown before they are only counted


class Source:
    """An import source that can be read more than once (stdin is spooled to a temporary file first)."""

    def __init__(self, source: str) -> None:
        self._path = None if source == "-" else Path(source)
        self._spool: IO[bytes] | None = None
        if self._path is None:
            self._spool = tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024)  # noqa: SIM115 - closed in close()
            shutil.copyfileobj(sys.stdin.buffer, self._spool)

    def items(self) -> Iterator[Raw]:
        """The source's items from the start (see ``imds.services.transfer.source``)."""
        if self._path is not None:
            return read_path(self._path)
        assert self._spool is not None  # noqa: S101 - set for stdin
        self._spool.seek(0)
        return read_stream(self._spool)

    def close(self) -> None:
        """Drop the spooled copy of stdin."""
        if self._spool is not None:
            self._spool.close()


class Survey:
    """The first pass over a source: how many items, the ids given twice, and (``--strict``) every rejection."""

    def __init__(self, raws: Iterator[Raw], parse: Callable[[Raw], Item], *, strict: bool) -> None:
        self.count = 0
        self.twice: list[tuple[str, Raw, Raw]] = []
        self.rejections: list[Result] = []
        first: dict[str, Raw] = {}
        for raw in raws:  # UnreadableInput goes up: the import stops before writing anything
            self.count += 1
            instance_id = raw.value.get("id") if isinstance(raw.value, dict) else None
            if isinstance(instance_id, str):
                # Where each id was first seen, without its document: a survey's memory is one
                # small entry per item, not the source (the documents are read again to write).
                seen = first.setdefault(instance_id.lower(), Raw(raw.label, raw.line, None))
                if seen.label != raw.label:
                    self.twice.append((instance_id.lower(), seen, Raw(raw.label, raw.line, None)))
            if strict:
                self._check(raw, parse)
        if strict:
            self.rejections += [Result(again.label, instance_id, "rejected",
                                       f"id: the same id as {seen.where} (--strict: each id once)")
                                for instance_id, seen, again in self.twice]

    def _check(self, raw: Raw, parse: Callable[[Raw], Item]) -> None:
        if isinstance(raw.value, InvalidInput):
            self.rejections.append(rejected(raw.label, None, raw.value))
            return
        try:
            parse(raw)
        except InvalidInput as exc:
            self.rejections.append(rejected(raw.label, raw.value, exc))


class Notes:
    """Warning lines on stderr: the first few of each kind, then only a count."""

    def __init__(self) -> None:
        self._counts: Counter[NoteKind] = Counter()

    def say(self, kind: NoteKind, text: str) -> None:
        """One warning of ``kind``."""
        self._counts[kind] += 1
        if self._counts[kind] <= SHOWN_NOTES:
            click.echo(f"warning: {text}", err=True)

    def close(self) -> None:
        """How many of each kind were not shown."""
        for kind, count in sorted(self._counts.items()):
            if count > SHOWN_NOTES:
                click.echo(f"warning: … and {count - SHOWN_NOTES} more {kind} warnings", err=True)


def _batches(
    raws: Iterator[Raw], size: int, rejections: list[Result], parse: Callable[[Raw], Item],
    notes: Callable[[Item], None],
) -> Iterator[list[Item]]:
    batch: list[Item] = []
    weight = 0
    for raw in raws:
        if isinstance(raw.value, InvalidInput):
            rejections.append(rejected(raw.label, None, raw.value))
            continue
        try:
            item = parse(raw)
        except InvalidInput as exc:
            rejections.append(rejected(raw.label, raw.value, exc))
            continue
        notes(item)
        batch.append(item)
        weight += len(json.dumps(raw.value))
        if len(batch) >= size or weight >= BATCH_BYTES:
            yield batch
            batch, weight = [], 0
    if batch:
        yield batch


def _remote_batch(target: Target, items: list[Item], objects: list[Any], *, dry_run: bool) -> list[Result]:
    assert target.remote is not None  # noqa: S101 - only called for --url
    answer = target.remote.send_json("POST", f"/device-records?dry_run={str(dry_run).lower()}", objects)
    return [Result(item.label, item.id, r["outcome"], r.get("reason")) for item, r in zip(items, answer["results"],
                                                                                        strict=True)]


def _hollow_dsn(_ctx: click.Context, _param: click.Parameter, dsn: str | None) -> str | None:
    """A malformed --from-hollow DSN is a usage error in one line (exit 2), before anything is opened."""
    if dsn is not None:
        try:
            parse_source(dsn)
        except DatabaseUrlError as exc:
            raise click.BadParameter(exc.message) from exc
    return dsn


@click.command(name="import")
@click.argument("source", required=False, type=click.Path(allow_dash=True, exists=False))
@target_options
@settings_options(("strict_records", "max_body_bytes"), table=tuple(o for o in OPTIONS if o.group == "limits"))
@click.option("--from-hollow", "hollow", metavar="DSN", default=None, callback=_hollow_dsn,
              help="Read a hollow-metadataservice database (postgresql://USER@HOST:PORT/DB, the forms --db takes) "
                   "instead of SOURCE; its password from PGPASSWORD or ~/.pgpass (flags show in ps).")
@click.option("--dry-run", is_flag=True, help="Compare and report; write nothing.")
@click.option("--strict", is_flag=True,
              help="Check every item first; write nothing if any is rejected or an id is given twice.")
@click.option("--batch-size", type=click.IntRange(1, 10000), default=1000, show_default=True,
              help="Items per transaction.")
@click.option("--progress-interval", type=float, default=5.0, show_default=True, hidden=True,
              help="Seconds between plain progress lines when stderr is not a terminal.")
def import_(  # noqa: PLR0913, PLR0917 - click passes every option
    source: str | None, hollow: str | None, dry_run: bool, strict: bool, batch_size: int, progress_interval: float,
    **flags: Any,
) -> None:
    """Create or replace instances from SOURCE: a JSON-lines file, a JSON array, a directory of *.json, or -.

    The whole source is read once before anything is written: input that is not UTF-8 or
    that the JSON parser cannot take stops the import (naming the line) with nothing written,
    and an id given twice is reported (the later item wins; --strict rejects the file). Items
    are held to the admin API's limits (--max-body-bytes, --strict-records ...).

    Or from a hollow-metadataservice database with --from-hollow DSN (and no SOURCE).
    """
    if (source is None) == (hollow is None):
        raise click.UsageError("give SOURCE or --from-hollow DSN (one of them)")
    if source is not None and source != "-" and not Path(source).exists():
        raise click.BadParameter(f"{source} does not exist", param_hint="SOURCE")
    rejections: list[Result] = []
    results: list[Result] = []
    with Target(flags) as target:
        limits = Limits.of(target.settings.limits)
        os_bytes = target.settings.ganeti.os_param_max_bytes

        def parse(raw: Raw) -> Item:
            return parse_item(raw.value, label=raw.label, max_os_value_bytes=os_bytes, limits=limits)

        opened = _open(source, hollow, batch_size)
        try:  # hollow's ids are unique: its items are checked first only for --strict
            survey = _survey(opened, parse, strict=strict) if hollow is None or strict else None
            if strict and survey is not None and survey.rejections:
                _report([], survey.rejections, dry_run=True, strict=True)
                raise SystemExit(1)
            if not dry_run:
                target.migrate()
            notes = Notes()
            offline = target.remote is None

            def note(item: Item) -> None:
                for found in item_notes(item, offline=offline):
                    notes.say(found.kind, f"{item.label} ({item.id}): {found.text}")

            if isinstance(opened, Source):
                total, read = (survey.count if survey is not None and source != "-" else None), None
            else:
                total, read = opened.total, opened.read
            progress = Progress(total, interval=progress_interval, read=read)
            try:
                results = _run(target, _batches(opened.items(), batch_size, rejections, parse, note), rejections,
                               progress, dry_run=dry_run)
            finally:
                seconds = progress.close()
                notes.close()
        finally:
            opened.close()
    _report(results, rejections, dry_run=dry_run, strict=False, seconds=seconds)
    if rejections:
        raise SystemExit(1)


def _open(source: str | None, hollow: str | None, page_size: int) -> Source | HollowItems:
    """The source to read: SOURCE, or the hollow database (connected and counted; asyncpg loads only for it)."""
    if hollow is None:
        assert source is not None  # noqa: S101 - import_ checks that one is given
        return Source(source)
    from imds.cli.hollow import HollowItems  # noqa: PLC0415

    return HollowItems(hollow, page_size=page_size)


def _survey(opened: Source | HollowItems, parse: Callable[[Raw], Item], *, strict: bool) -> Survey:
    """The first pass; unreadable input ends the import here, before anything is written."""
    try:
        survey = Survey(opened.items(), parse, strict=strict)
    except UnreadableInput as exc:
        raise click.ClickException(f"{exc.message} (nothing was written)") from exc
    for instance_id, seen, again in survey.twice:
        click.echo(f"warning: instance {instance_id} is given twice: {seen.where} and {again.where}"
                   + (" (--strict: the file is rejected)" if strict else " (the later one wins)"), err=True)
    return survey


def _run(
    target: Target, batches: Iterator[list[Item]], rejections: list[Result], progress: Progress, *, dry_run: bool,
) -> list[Result]:
    results: list[Result] = []
    if target.remote is not None:
        for batch in batches:
            wire = [_wire_object(item) for item in batch]
            done = _remote_batch(target, batch, wire, dry_run=dry_run)
            results += done
            progress.advance(len(batch), done, rejected=len(rejections))
        return results

    async def run(offline: Any) -> list[Result]:
        done: list[Result] = []
        for batch in batches:
            written = await offline.upsert(batch, subject=SUBJECT, dry_run=dry_run)
            done += written
            progress.advance(len(batch), written, rejected=len(rejections))
        return done

    return target.offline(run)


def _item_object(item: Item) -> dict[str, Any]:
    """The wire object of a parsed item, for POST /device-records (normalised, so parsed once more the same)."""
    from imds.services.catalog.addresses import display  # noqa: PLC0415

    first = item.metadata or item.userdata
    assert first is not None  # noqa: S101 - parse_item guarantees one part
    obj: dict[str, Any] = {"id": item.id, "ipAddresses": [display(a) for a in first.addresses]}
    if item.metadata is not None:
        obj["metadata"] = item.metadata.metadata
    if item.userdata is not None:
        import base64  # noqa: PLC0415

        obj["userdata"], obj["userdata_encoding"] = base64.b64encode(item.userdata.userdata).decode(), "base64"
    if item.os is not None:
        from imds.services.ganeti.transfer import os_write_to_wire  # noqa: PLC0415

        obj["os"] = os_write_to_wire(item.os)
    return obj


def _wire_object(item: Item) -> dict[str, Any]:
    """What POST /device-records takes for ``item``: an instance's upsert object, or ``{"notice": {...}}``."""
    if item.notice is None:
        return _item_object(item)
    from imds.services.notices.wire import notice_wire  # noqa: PLC0415

    return {"notice": notice_wire(*item.notice)}


def _report(
    results: list[Result], rejections: list[Result], *, dry_run: bool, strict: bool, seconds: float = 0.0,
) -> None:
    counts = Counter(result.outcome for result in results)
    counts["rejected"] += len(rejections)
    line = ", ".join(f"{counts[outcome]} {outcome}" for outcome in OUTCOMES)
    if strict:
        line += " (--strict: nothing written)"
    elif dry_run:
        line += " (dry run: nothing written)"
    elif seconds > 0 and results:
        line += f" in {seconds:.1f} s ({len(results) / seconds:.0f} items/s)"
    click.echo(line)
    for result in [*sorted(rejections, key=_order), *(r for r in results if r.outcome == "stale")]:
        shown = f" ({result.id})" if result.id else ""
        click.echo(f"{result.outcome} {result.label}{shown}: {result.reason}")


def _order(result: Result) -> tuple[str, int]:
    kind, _, number = result.label.partition(" ")
    return (kind, int(number)) if number.isdigit() else (result.label, 0)


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
