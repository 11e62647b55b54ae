"""``imds import`` and ``imds export``: whole fleets in the upsert wire format, on the database or a server.

Input: JSON lines, a JSON array, or a directory of per-instance ``*.json`` files, each
object one instance (``id``, ``ipAddresses``, ``metadata`` and/or ``userdata``, as ``imds
export`` writes and ``POST /device-metadata`` / ``/device-userdata`` take). Items go in
batches, each one transaction (``imds.services.records.bulk``); an item that would change nothing
is ``unchanged`` and not written, so a re-run reports everything unchanged. Progress goes to
stderr (a bar on a terminal, a line every few seconds otherwise); the summary and every
rejected item (with its line and reason) go to stdout.

``--from-hollow DSN`` reads a hollow-metadataservice database instead of SOURCE
(``imds.cli.hollow``). On the database, a new or empty one is migrated first, as
``imds serve`` does at start-up (``IMDS_MIGRATE=false`` turns that off).
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import click

from imds.cli.records import SUBJECT, Target, target_options
from imds.errors import InvalidInput
from imds.services.records.bulk import OUTCOMES, Item, Result, parse_item, rejected

BATCH_BYTES = 512 * 1024  # per POST /device-records, under the default --max-body-bytes (1 MiB)


def read_objects(source: str) -> Iterator[tuple[str, Any]]:
    """(label, parsed object or InvalidInput) for each item of a JSON-lines file, JSON array or directory."""
    if source != "-" and Path(source).is_dir():
        for path in sorted(Path(source).glob("*.json")):
            yield path.name, _decode(path.read_text(encoding="utf-8"))
        return
    stream: IO[str] = sys.stdin if source == "-" else Path(source).open(encoding="utf-8")  # noqa: SIM115 - closed below
    try:
        first = _first_char(stream)
        if first == "[":
            whole = _decode(first + stream.read())
            if isinstance(whole, InvalidInput):
                yield "line 1", whole
                return
            for number, obj in enumerate(whole if isinstance(whole, list) else [whole], 1):
                yield f"item {number}", obj
            return
        for number, line in enumerate((first + stream.readline(), *stream), 1):
            if line.strip():
                yield f"line {number}", _decode(line)
    finally:
        if stream is not sys.stdin:
            stream.close()


def count_items(source: str) -> int | None:
    """How many items ``source`` holds, when that is cheap to know (None for stdin)."""
    if source == "-":
        return None
    path = Path(source)
    if path.is_dir():
        return sum(1 for _ in path.glob("*.json"))
    with path.open(encoding="utf-8") as stream:
        if _first_char(stream) == "[":
            return None  # counted when parsed
        stream.seek(0)
        return sum(1 for line in stream if line.strip())


def _first_char(stream: IO[str]) -> str:
    while (char := stream.read(1)) and char.isspace():
        pass
    return char


def _decode(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        return InvalidInput.one("json", f"not valid JSON: {exc.msg} at column {exc.colno}")


class Progress:
    """A rich bar with rate and ETA on a terminal; otherwise a plain line every ``interval`` seconds."""

    def __init__(
        self, total: int | None, *, interval: float, clock: Callable[[], float] = time.monotonic,
        read: Callable[[], int] | None = None,
    ) -> None:
        self._total, self._interval, self._clock, self._read = total, interval, clock, read
        self._done = self._written = 0
        self._started = self._last = clock()
        self._bar: Any = None
        if sys.stderr.isatty():
            from rich import progress as rich_progress  # noqa: PLC0415 - rich loads only on a terminal
            from rich.console import Console  # noqa: PLC0415

            self._bar = rich_progress.Progress(
                rich_progress.TextColumn("importing"), rich_progress.BarColumn(), rich_progress.MofNCompleteColumn(),
                rich_progress.TaskProgressColumn(), rich_progress.TextColumn("{task.fields[rate]}/s"),
                rich_progress.TimeRemainingColumn(), transient=True, console=Console(stderr=True),
            )
            self._task = self._bar.add_task("import", total=total, rate="-")
            self._bar.start()

    def advance(self, count: int, results: list[Result] | None = None, *, rejected: int = 0) -> None:
        """``count`` more items are done (``results``: their outcomes); ``rejected`` so far, done too."""
        self._done += count
        self._written += sum(r.outcome in ("created", "updated") for r in results or [])
        done = self._done + rejected
        now = self._clock()
        rate = done / max(now - self._started, 1e-9)
        if self._bar is not None:
            self._bar.update(self._task, completed=done, rate=f"{rate:.0f}")
        elif now - self._last >= self._interval:
            self._last = now
            of = f"/{self._total}" if self._total is not None else ""
            read = f"{self._read()} read, " if self._read is not None else ""
            click.echo(f"imds import: {done}{of} items ({read}{self._written} written, {rate:.0f}/s)", err=True)

    def close(self) -> float:
        """Stop the bar; the seconds taken."""
        if self._bar is not None:
            self._bar.stop()
        return self._clock() - self._started


def _batches(objects: Iterator[tuple[str, Any]], size: int, rejections: list[Result]) -> Iterator[list[Item]]:
    batch: list[Item] = []
    weight = 0
    for label, obj in objects:
        if isinstance(obj, InvalidInput):
            rejections.append(rejected(label, None, obj))
            continue
        try:
            batch.append(parse_item(obj, label=label))
        except InvalidInput as exc:
            rejections.append(rejected(label, obj, exc))
            continue
        weight += len(json.dumps(obj))
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


@click.command(name="import")
@click.argument("source", required=False, type=click.Path(allow_dash=True, exists=False))
@target_options
@click.option("--from-hollow", "hollow", metavar="DSN", default=None,
              help="Read a hollow-metadataservice database (postgresql://USER@HOST:PORT/DB) instead of SOURCE; "
                   "its password from PGPASSWORD or ~/.pgpass (flags show in ps).")
@click.option("--dry-run", is_flag=True, help="Compare and report; write nothing.")
@click.option("--strict", is_flag=True, help="Check every item first; write nothing if any is rejected.")
@click.option("--batch-size", type=click.IntRange(1, 10000), default=1000, show_default=True,
              help="Items per transaction.")
@click.option("--progress-interval", type=float, default=5.0, show_default=True, hidden=True,
              help="Seconds between plain progress lines when stderr is not a terminal.")
def import_(  # noqa: PLR0913, PLR0917 - click passes every option
    source: str | None, hollow: str | None, dry_run: bool, strict: bool, batch_size: int, progress_interval: float,
    **flags: Any,
) -> None:
    """Create or replace instances from SOURCE: a JSON-lines file, a JSON array, a directory of *.json, or -.

    Or from a hollow-metadataservice database with --from-hollow DSN (and no SOURCE).
    """
    if (source is None) == (hollow is None):
        raise click.UsageError("give SOURCE or --from-hollow DSN (one of them)")
    if source is not None and source != "-" and not Path(source).exists():
        raise click.BadParameter(f"{source} does not exist", param_hint="SOURCE")
    rejections: list[Result] = []
    results: list[Result] = []
    with Target(flags) as target:
        read_all, total, read = _source(source, hollow, batch_size)
        if not dry_run:
            target.migrate()
        objects = list(read_all()) if strict else None  # --strict checks everything first
        if strict:
            list(_batches(iter(objects or []), batch_size, rejections))
            if rejections:
                _report([], rejections, dry_run=True, strict=True)
                raise SystemExit(1)
        progress = Progress(total if objects is None else len(objects), interval=progress_interval, read=read)
        try:
            results = _run(target, iter(objects) if objects is not None else read_all(), batch_size,
                           rejections, progress, dry_run=dry_run)
        finally:
            seconds = progress.close()
    _report(results, rejections, dry_run=dry_run, strict=False, seconds=seconds)
    if rejections:
        raise SystemExit(1)


def _source(
    source: str | None, hollow: str | None, page_size: int,
) -> tuple[Callable[[], Iterator[tuple[str, Any]]], int | None, Callable[[], int] | None]:
    """How to read every item, how many there are (None: unknown), and how many were read so far (hollow)."""
    if hollow is None:
        assert source is not None  # noqa: S101 - import_ checks that one is given
        return lambda: read_objects(source), count_items(source), None
    from imds.cli.hollow import HollowObjects  # noqa: PLC0415 - asyncpg loads only for --from-hollow

    reader = HollowObjects(hollow, page_size=page_size)
    return lambda: iter(reader), reader.start(), lambda: reader.read


def _run(  # noqa: PLR0913 - the pieces of one import
    target: Target, objects: Iterator[tuple[str, Any]], batch_size: int, rejections: list[Result],
    progress: Progress, *, dry_run: bool,
) -> list[Result]:
    results: list[Result] = []
    if target.remote is not None:
        for batch in _batches(objects, batch_size, rejections):
            wire = [_item_object(item) for item in batch]
            done = _remote_batch(target, batch, wire, dry_run=dry_run)
            results += done
            progress.advance(len(batch), done, rejected=len(rejections))
        return results

    async def run(offline: Any) -> list[Result]:
        done: list[Result] = []
        for batch in _batches(objects, batch_size, rejections):
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
def export(destination: str, fmt: str, no_private: bool, **flags: Any) -> None:
    """Write every instance to DESTINATION (default: stdout) in the upsert format imds import reads.

    An instance's Ganeti OS record is exported with it ("os"), private values decrypted
    with --private-key-file unless --no-private.
    """
    if fmt == "dir" and destination == "-":
        raise click.UsageError("--format dir needs a DESTINATION directory")
    with Target(flags) as target:
        if target.remote is not None:
            query = "?private=false" if no_private else ""
            records: Iterator[dict[str, Any]] = target.remote.lines(f"/device-records{query}")
            count = _write(records, destination, fmt)
        else:
            from imds.services.records.readout import to_wire  # noqa: PLC0415

            async def read(offline: Any) -> list[Any]:
                cipher = offline.os.cipher
                return [to_wire(instance, cipher, private=not no_private) for instance in await offline.all()]

            count = _write(iter(target.offline(read)), destination, fmt)
    click.echo(f"exported {count} instance{'s' if count != 1 else ''}", err=True)


def _write(records: Iterator[dict[str, Any]], destination: str, fmt: str) -> int:
    """Stream ``records`` out as ``fmt``; how many were written."""
    count = 0
    if fmt == "dir":
        folder = Path(destination)
        folder.mkdir(parents=True, exist_ok=True)
        for record in records:
            (folder / f"{record['id']}.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
            count += 1
        return count
    with click.open_file(destination, "w", encoding="utf-8", atomic=destination != "-") as out:
        if fmt == "json":
            out.write("[")
        for record in records:
            line = json.dumps(record, separators=(",", ":"), sort_keys=True)
            out.write((("," if count else "") + "\n" + line) if fmt == "json" else line + "\n")
            count += 1
        if fmt == "json":
            out.write("\n]\n")
    return count
