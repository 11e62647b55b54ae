"""``imds import``: whole fleets in the upsert wire format, into the database or a server.

Input: JSON lines, a JSON array (read one element at a time), or a directory of per-instance
``*.json`` files, each object one instance (``id``, ``ipAddresses``, ``metadata`` and/or
``userdata``, as ``imds export`` writes and ``POST /device-metadata`` / ``/device-userdata``
take), held to the admin API's limits. The source is read twice: first to check that it can
be read at all (UTF-8, parseable: otherwise nothing is written) and to find ids given twice
(a warning naming both lines; ``--strict`` rejects the file), then to write. An item longer
than the row cap (16 x ``--max-body-bytes``) is rejected by its size, unread, so memory is
bounded by the cap, not by the data. Items go in batches (``imds.services.transfer.bulk``), all
in one transaction on the database: a database error leaves nothing written. ``--partial``
commits each batch as it goes instead (other writers then interleave; a failure can leave
earlier batches written); with ``--url`` each batch is one request, so more than one batch
needs ``--partial``. An item that would change nothing
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

import codecs
import gc
import json
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import click

from imds.cli.options import settings_options
from imds.cli.progress import Progress
from imds.cli.records import SUBJECT, Target, target_options
from imds.config import OPTIONS
from imds.config.database import DatabaseUrlError, parse_source
from imds.errors import InvalidInput, StoreUnavailable
from imds.services.records.limits import Limits, max_item_bytes
from imds.services.records.wire import NoteKind
from imds.services.transfer.bulk import OUTCOMES, Block, Item, Result, item_notes, parse_item, rejected
from imds.services.transfer.source import CHUNK, Raw, UnreadableInput, read_path, read_stream

if TYPE_CHECKING:
    from imds.cli.hollow import HollowItems
    from imds.services.offline import OfflineRecords

BATCH_BYTES = 512 * 1024  # per POST /device-records, under the default --max-body-bytes (1 MiB)
BATCHES_NEED_PARTIAL = ("more than one batch goes to the server as requests, each its own transaction: give "
                        "--partial to accept that a failure may leave earlier ones written (or import on the "
                        "database with --db / --data-dir, in one transaction)")
SHOWN_NOTES = 20  # warning lines of one kind shown before they are only counted


class Source:
    """An import source that can be read more than once (stdin is spooled to a temporary file first)."""

    def __init__(self, source: str, max_item_bytes: int) -> None:
        self._path = None if source == "-" else Path(source)
        self._cap = max_item_bytes
        self._spool: IO[bytes] | None = None
        if self._path is None:
            self._spool = tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024)  # noqa: SIM115 - closed in close()
            shutil.copyfileobj(sys.stdin.buffer, self._spool)

    def items(self) -> Iterator[Raw]:
        """The source's items from the start (see ``imds.services.transfer.source``)."""
        if self._path is not None:
            return read_path(self._path, self._cap)
        assert self._spool is not None  # noqa: S101 - set for stdin
        self._spool.seek(0)
        return read_stream(self._spool, self._cap)

    def count(self) -> int | None:
        """How many items a file or directory holds, without parsing them (None: stdin, or a JSON array)."""
        if self._path is None:
            return None
        if self._path.is_dir():
            return sum(1 for _ in self._path.glob("*.json"))
        lines, last = 0, b"\n"
        with self._path.open("rb") as stream:  # a chunk at a time: a line over the row cap is never held
            head = stream.read(CHUNK)
            if head.removeprefix(codecs.BOM_UTF8).lstrip(b" \t\r\n").startswith(b"["):
                return None
            chunk = head
            while chunk:
                lines += chunk.count(b"\n") - chunk.count(b"\n\n")  # blank lines are no items
                last = chunk[-1:]
                chunk = stream.read(CHUNK)
        return lines + (last != b"\n")

    def close(self) -> None:
        """Drop the spooled copy of stdin."""
        if self._spool is not None:
            self._spool.close()


class Twice:
    """Ids given twice: where each id was first seen, without its document (one small entry per item)."""

    def __init__(self) -> None:
        self._first: dict[str, Raw] = {}

    def see(self, raw: Raw) -> tuple[str, Raw, Raw] | None:
        """(id, where first, here) when ``raw``'s id was seen before; else None."""
        instance_id = raw.value.get("id") if isinstance(raw.value, dict) else None
        if not isinstance(instance_id, str):
            return None
        here = Raw(raw.label, raw.line, None)
        seen = self._first.setdefault(instance_id.lower(), here)
        return (instance_id.lower(), seen, here) if seen.label != raw.label else None


def say_twice(instance_id: str, seen: Raw, again: Raw, *, strict: bool) -> None:
    """The warning for an id given twice."""
    click.echo(f"warning: instance {instance_id} is given twice: {seen.where} and {again.where}"
               + (" (--strict: the file is rejected)" if strict else " (the later one wins)"), err=True)


class Survey:
    """The first pass over a source: how many items, the ids given twice, and (``--strict``) every rejection."""

    def __init__(self, raws: Iterator[Raw], parse: Callable[[Raw], Item], *, strict: bool, weigh: bool) -> None:
        self.count = 0
        self.weight = 0  # bytes of the items as JSON (``weigh``: an import over --url without --partial)
        self.twice: list[tuple[str, Raw, Raw]] = []
        self.rejections: list[Result] = []
        twice = Twice()
        for raw in raws:  # UnreadableInput goes up: the import stops before writing anything
            self.count += 1
            if (found := twice.see(raw)) is not None:
                self.twice.append(found)
            if strict:
                self._check(raw, parse)
            if weigh and not isinstance(raw.value, InvalidInput):
                self.weight += len(json.dumps(raw.value))
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

    def written(self, results: list[Result]) -> None:
        """What the writes said: each address taken from another instance (never silent)."""
        for result in results:
            for text in result.warnings:
                self.say(NoteKind.MOVED, f"{result.label} ({result.id}): {text}")

    def close(self) -> None:
        """How many of each kind were not shown."""
        for kind, count in sorted(self._counts.items()):
            if count > SHOWN_NOTES:
                click.echo(f"warning: … and {count - SHOWN_NOTES} more {kind} warnings", err=True)


def _batches(  # noqa: PLR0913 - the pieces of one import
    raws: Iterator[Raw], size: int, rejections: list[Result], parse: Callable[[Raw], Item],
    notes: Callable[[Item], None], *, remote: bool, twice: Twice | None,
) -> Iterator[list[Item]]:
    """Parsed items in batches of ``size``, or fewer when their text reaches BATCH_BYTES (as JSON, for --url).

    ``twice``: no survey came first (one pass), so ids given twice are said as they are met.
    """
    batch: list[Item] = []
    weight = 0
    for raw in raws:
        if twice is not None and (found := twice.see(raw)) is not None:
            say_twice(*found, strict=False)
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
        weight += len(json.dumps(raw.value)) if remote or not raw.size else raw.size
        if len(batch) >= size or weight >= BATCH_BYTES:
            yield batch
            batch, weight = [], 0
    if batch:
        yield batch


def _remote_batch(target: Target, items: list[Item], objects: list[Any], *, dry_run: bool) -> list[Result]:
    assert target.remote is not None  # noqa: S101 - only called for --url
    answer = target.remote.send_json("POST", f"/device-records?dry_run={str(dry_run).lower()}", objects)
    return [Result(item.label, item.id, r["outcome"], r.get("reason"), tuple(r.get("warnings", ())))
            for item, r in zip(items, answer["results"], strict=True)]


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
@settings_options(("strict_records", "max_body_bytes", "allow_wide_prefixes"),
                  table=tuple(o for o in OPTIONS if o.group == "limits"))
@click.option("--from-hollow", "hollow", metavar="DSN", default=None, callback=_hollow_dsn,
              help="Read a hollow-metadataservice database (postgresql://USER@HOST:PORT/DB, the forms --db takes) "
                   "instead of SOURCE; its password from PGPASSWORD or ~/.pgpass (flags show in ps).")
@click.option("--dry-run", is_flag=True, help="Compare and report; write nothing.")
@click.option("--strict", is_flag=True,
              help="Check every item first; write nothing if any is rejected or an id is given twice.")
@click.option("--batch-size", type=click.IntRange(1, 10000), default=1000, show_default=True,
              help="Items per batch (per request with --url).")
@click.option("--partial", is_flag=True,
              help="Commit each batch as it goes: a failure may leave earlier batches written "
                   "(default: one transaction, nothing written on a failure).")
@click.option("--progress-interval", type=float, default=5.0, show_default=True, hidden=True,
              help="Seconds between plain progress lines when stderr is not a terminal.")
def import_(  # noqa: PLR0913, PLR0917 - click passes every option
    source: str | None, hollow: str | None, dry_run: bool, strict: bool, batch_size: int, partial: bool,
    progress_interval: float, **flags: Any,
) -> None:
    """Create or replace instances from SOURCE: a JSON-lines file, a JSON array, a directory of *.json, or -.

    The whole source is read once before anything is written. Input that cannot be read at
    all (not UTF-8, nested too deeply, a JSON array that does not parse) stops the import,
    naming the line, and nothing is written. A line that is not valid JSON is rejected like
    any other bad item (named, with its reason) and the other items are written, unless
    --strict. An item longer than 16 x --max-body-bytes is rejected unread. An id given
    twice is reported (the later item wins; --strict rejects the file). Items are held to
    the admin API's limits (--max-body-bytes, --strict-records ...).

    The import is one transaction: a database error leaves nothing written (other writers
    wait until it commits). --partial commits each batch as it goes instead, so a failure
    may leave earlier batches written. With --url each batch is one request: more than one
    batch needs --partial.

    Or from a hollow-metadataservice database with --from-hollow DSN (and no SOURCE).
    """
    _given(source, hollow)
    rejections: list[Result] = []
    results: list[Result] = []
    with Target(flags) as target:
        limits = Limits.of(target.settings.limits)
        os_bytes = target.settings.ganeti.os_param_max_bytes
        one_request = target.remote is not None and not partial and not dry_run
        if one_request and hollow is not None:
            raise click.UsageError(f"--from-hollow --url: {BATCHES_NEED_PARTIAL}")

        def parse(raw: Raw) -> Item:
            return parse_item(raw.value, label=raw.label, max_os_value_bytes=os_bytes, limits=limits, size=raw.size)

        opened = _open(source, hollow, batch_size, limits)
        # One transaction on the database: input found unreadable half-way is rolled back with the
        # rest, so a file is read once. Batches that commit apart (--partial, --url) or --strict
        # check it whole first. hollow's ids are unique: it is checked first only for --strict.
        first = strict or (hollow is None and (partial or target.remote is not None))
        try:
            survey = _survey(opened, parse, strict=strict, weigh=one_request) if first else None
            if survey is not None:
                _check(survey, strict=strict, one_request=one_request, batch_size=batch_size)
            if not dry_run:
                target.migrate()
            notes = Notes()
            offline = target.remote is None

            def note(item: Item) -> None:
                for found in item_notes(item, offline=offline):
                    notes.say(found.kind, f"{item.label} ({item.id}): {found.text}")

            if isinstance(opened, Source):
                total, read = (survey.count if survey is not None and source != "-" else opened.count()), None
            else:
                total, read = opened.total, opened.read
            progress = Progress(total, interval=progress_interval, read=read)
            try:
                twice = Twice() if survey is None and hollow is None else None
                batches = _batches(opened.items(), batch_size, rejections, parse, note, remote=not offline,
                                   twice=twice)
                results = _run(target, batches, rejections, progress, dry_run=dry_run, partial=partial)
                notes.written(results)
            finally:
                seconds = progress.close()
                notes.close()
        finally:
            opened.close()
    _report(results, rejections, dry_run=dry_run, strict=False, seconds=seconds)
    if rejections:
        raise SystemExit(1)


def _given(source: str | None, hollow: str | None) -> None:
    """SOURCE or --from-hollow, one of them; a SOURCE that exists."""
    if (source is None) == (hollow is None):
        raise click.UsageError("give SOURCE or --from-hollow DSN (one of them)")
    if source is not None and source != "-" and not Path(source).exists():
        raise click.BadParameter(f"{source} does not exist", param_hint="SOURCE")


def _open(source: str | None, hollow: str | None, page_size: int, limits: Limits) -> Source | HollowItems:
    """The source to read: SOURCE, or the hollow database (connected and counted; asyncpg loads only for it)."""
    if hollow is None:
        assert source is not None  # noqa: S101 - import_ checks that one is given
        return Source(source, max_item_bytes(limits))
    from imds.cli.hollow import HollowItems  # noqa: PLC0415

    return HollowItems(hollow, page_size=page_size, limits=limits)


def _survey(opened: Source | HollowItems, parse: Callable[[Raw], Item], *, strict: bool, weigh: bool) -> Survey:
    """The first pass; unreadable input ends the import here, before anything is written."""
    try:
        survey = Survey(opened.items(), parse, strict=strict, weigh=weigh)
    except UnreadableInput as exc:
        raise click.ClickException(f"{exc.message} (nothing was written)") from exc
    for instance_id, seen, again in survey.twice:
        say_twice(instance_id, seen, again, strict=strict)
    return survey


def _check(survey: Survey, *, strict: bool, one_request: bool, batch_size: int) -> None:
    """Stop before writing: --strict with a rejection, or more than one request over --url without --partial."""
    if strict and survey.rejections:
        _report([], survey.rejections, dry_run=True, strict=True)
        raise SystemExit(1)
    if one_request and (survey.count > batch_size or survey.weight >= BATCH_BYTES):
        raise click.UsageError(f"{survey.count} items ({survey.weight} bytes): {BATCHES_NEED_PARTIAL}")


def _run(  # noqa: PLR0913 - the pieces of one import
    target: Target, batches: Iterator[list[Item]], rejections: list[Result], progress: Progress, *, dry_run: bool,
    partial: bool,
) -> list[Result]:
    results: list[Result] = []
    if target.remote is not None:
        for batch in batches:
            wire = [_wire_object(item) for item in batch]
            done = _remote_batch(target, batch, wire, dry_run=dry_run)
            results += done
            progress.advance(len(batch), done, rejected=len(rejections))
        return results

    def advance(count: int, written: list[Result]) -> None:
        progress.advance(count, written, rejected=len(rejections))

    async def run(offline: OfflineRecords) -> list[Result]:
        if partial or dry_run:
            try:
                return (await _offline_batches(offline, batches, None, advance, dry_run=dry_run))[0]
            except StoreUnavailable as exc:
                raise StoreUnavailable(f"{exc.message} (--partial: the batches before this one are written)") from exc
        return await _one_transaction(offline, batches, advance)

    return target.offline(run)


async def _one_transaction(
    offline: OfflineRecords, batches: Iterator[list[Item]], advance: Callable[[int, list[Result]], None],
) -> list[Result]:
    """Every instance in one store block; then the notices, each in a transaction of its own."""
    try:
        async with offline.transaction() as block:
            done, later = await _offline_batches(offline, batches, block, advance, dry_run=False)
    except UnreadableInput as exc:  # found by the one pass: rolled back with everything before it
        raise click.ClickException(f"{exc.message} (nothing was written)") from exc
    except StoreUnavailable as exc:
        raise StoreUnavailable(f"{exc.message}: nothing was written (the import is one transaction; "
                               "--partial commits batch by batch)") from exc
    if later:
        done += (await _offline_batches(offline, iter([later]), None, advance, dry_run=False))[0]
    return done


async def _offline_batches(
    offline: OfflineRecords, batches: Iterator[list[Item]], block: Block | None,
    advance: Callable[[int, list[Result]], None], *, dry_run: bool,
) -> tuple[list[Result], list[Item]]:
    """Every batch's instances (in ``block`` when given); the notices a block leaves for after it."""
    done: list[Result] = []
    later: list[Item] = []
    for batch in batches:
        if block is not None:  # a notice is written in its own transaction: after the block has committed
            later += [item for item in batch if item.notice is not None]
            batch = [item for item in batch if item.notice is None]  # noqa: PLW2901 - the block's part
        written = await offline.upsert(batch, subject=SUBJECT, dry_run=dry_run, block=block)
        done += written
        advance(len(batch), written)
        # What is left after a batch (its results, the ids met) lives until the import ends: keep the
        # cyclic GC from re-scanning it on every collection the next batches trigger (a fifth of the
        # CPU of a 100,000-instance import). Refcounting still frees what the batches drop.
        gc.freeze()
    return done, later


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
