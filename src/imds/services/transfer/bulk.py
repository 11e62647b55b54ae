"""Many upserts at once (``imds import``, ``POST /device-records``): parse, compare, write in batches.

Each item is one instance in the upsert wire format (``imds.services.transfer.readout``): ``id``,
``ipAddresses`` and ``metadata`` and/or ``userdata``, and optionally ``os`` (the Ganeti OS
record, written after the others through ``OsRecords.put``); or one lifecycle notice,
``{"notice": {...}}`` as ``imds export`` writes it (``imds.services.notices.wire``), put back
as it was through ``NoticeRecords.restore``. A batch is compared with what is
stored first, so an item that would change nothing is reported ``unchanged`` and not
written (a re-run of the same import writes nothing); the rest go through
``Records.put_many`` (the admin API's rules, one transaction per batch).

::

    items = [parse_item(obj, label=f"line {n}") for n, obj in enumerate(objects, 1)]
    outcomes = await apply_batch(records, store, items, subject="imds-cli")
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from imds.errors import InvalidInput, Problem
from imds.models import SECRET, Acknowledgement, Instance, MetadataWrite, Notice, UserdataWrite
from imds.services.ganeti.records import OsRecords
from imds.services.ganeti.transfer import os_unchanged, parse_os_item
from imds.services.ganeti.wire import SECTIONS, OsWrite
from imds.services.notices.records import NoticeRecords
from imds.services.notices.wire import parse_exported
from imds.services.records.limits import Limits, check_size
from imds.services.records.upsert import Records
from imds.services.records.wire import (
    DEFAULT_LIMITS,
    Note,
    NoteKind,
    moved_notes,
    notes,
    parse_metadata_write,
    parse_userdata_write,
)
from imds.store import Store, WriteTx

# An item's metadata, written back as compact JSON (``\u`` escapes), is at most GROWTH times as long
# as the item's text plus GROWTH_SLACK: a character read (a byte or more) becomes at most 12 bytes (an
# astral character as a surrogate pair, ``\ud83d\ude00``), a number at most 4.5 times its digits
# (``1e15``: ``1000000000000000.0``); separators and white space only shrink, and the ``host`` a write
# may name beside the document is in the item's text too. So an item shorter than max_body_bytes / 12
# cannot carry metadata over the limit, and its document is not encoded again to measure it.
GROWTH, GROWTH_SLACK = 12, 1024
Outcome = Literal["created", "updated", "unchanged", "stale", "rejected"]
OUTCOMES: tuple[Outcome, ...] = ("created", "updated", "unchanged", "stale", "rejected")


@dataclass(frozen=True, slots=True)
class Item:
    """One parsed upsert; ``label`` says where it came from (``line 12``, ``web-1.json``)."""

    label: str
    id: str
    metadata: MetadataWrite | None
    userdata: UserdataWrite | None
    os: OsWrite | None = None
    notice: tuple[Notice, list[Acknowledgement]] | None = None  # a notice item (no instance parts then)


@dataclass(frozen=True, slots=True)  # an import keeps one per item until its report: no __dict__ each
class Result:
    """What happened to one item (``reason`` for stale and rejected ones)."""

    label: str
    id: str | None
    outcome: Outcome
    reason: str | None = None
    warnings: tuple[str, ...] = ()  # addresses the write took from other instances


def parse_item(
    obj: Any, *, label: str, max_os_value_bytes: int = 4096, limits: Limits = DEFAULT_LIMITS, size: int = 0,
) -> Item:
    """An upsert object → Item, or InvalidInput naming every offending field.

    ``limits`` are the admin API's (``Limits.of(settings.limits)``): an item may hold no more
    than one admin write could (its userdata and its metadata each at most ``max_body_bytes``).
    ``size``: the length of the item's text as read (bytes or characters; 0: not known).
    """
    if not isinstance(obj, dict):
        raise InvalidInput.one("item", "must be a JSON object")
    if "notice" in obj:
        return _notice_item(obj, label)
    return _instance_item(obj, label=label, max_os_value_bytes=max_os_value_bytes, limits=limits, size=size)


def _instance_item(obj: dict[str, Any], *, label: str, max_os_value_bytes: int, limits: Limits, size: int) -> Item:
    if "metadata" not in obj and "userdata" not in obj:
        raise InvalidInput([Problem("metadata", "or userdata is required (an item carries at least one)")])
    problems: list[Problem] = []
    metadata = userdata = None
    if "metadata" in obj:
        try:
            metadata = parse_metadata_write({k: obj.get(k) for k in ("id", "ipAddresses", "metadata", "host")}, limits)
        except InvalidInput as exc:
            problems += exc.problems
    if "userdata" in obj:
        try:  # the metadata part read the same ipAddresses (its problems are said once, by it)
            userdata = parse_userdata_write(obj, limits, addresses=None if metadata is None else metadata.addresses)
        except InvalidInput as exc:
            problems += [p for p in exc.problems if p not in problems]
    problems += _oversized(metadata, userdata, limits, size)
    first = metadata or userdata
    os_write = None
    if "os" in obj and first is not None:
        try:
            os_write = parse_os_item(obj["os"], first.id, max_value_bytes=max_os_value_bytes)
        except InvalidInput as exc:
            problems += exc.problems
    if problems or first is None:
        raise InvalidInput(problems)
    return Item(label, first.id, metadata, userdata, os_write)


def _notice_item(obj: dict[str, Any], label: str) -> Item:
    if set(obj) != {"notice"}:
        raise InvalidInput.one("notice", 'a notice item holds the notice alone: {"notice": {...}}')
    try:
        notice, acks = parse_exported(obj["notice"])
    except InvalidInput as exc:
        raise InvalidInput([Problem(f"notice.{p.field}", p.message) for p in exc.problems]) from exc
    return Item(label, notice.id, None, None, notice=(notice, acks))


def _oversized(
    metadata: MetadataWrite | None, userdata: UserdataWrite | None, limits: Limits, size: int,
) -> list[Problem]:
    """The parts larger than one admin write may carry (the admin API refuses such a body with 413).

    The metadata is measured as compact JSON, unless the item's own text (``size``) is too short
    for it to be that large: see ``GROWTH``.
    """
    sizes = []
    if userdata is not None:
        sizes.append(("userdata", len(userdata.userdata)))
    short = size > 0 and GROWTH * size + GROWTH_SLACK <= limits.max_body_bytes
    if metadata is not None and not short:
        sizes.append(("metadata", len(json.dumps(metadata.metadata, separators=(",", ":")))))  # ASCII: bytes
    return [problem for field, size in sizes if (problem := check_size(field, size, limits)) is not None]


def item_notes(item: Item, *, offline: bool) -> list[Note]:
    """What an import says about one item besides its outcome: hollow's readings and dropped secrets.

    ``offline``: the import writes to the database, where secret OS values are never stored
    (a server holds them in its memory only), so each one is named as dropped.
    """
    first = item.metadata or item.userdata
    found = notes(first) if first is not None else []
    if offline and item.os is not None:
        found += [Note(NoteKind.OS, f"os.{section}.{name}: a secret value is never stored in the database; this import "
                                    f"drops it (push it to a running server: imds import --url, or POST /device-os)")
                  for section in SECTIONS for name, param in getattr(item.os, section).items()
                  if param.visibility == SECRET]
    return found


def rejected(label: str, obj: Any, exc: InvalidInput) -> Result:
    """The Result for an item that did not parse (its id, when it has a readable one)."""
    instance_id = obj.get("id") if isinstance(obj, dict) and isinstance(obj.get("id"), str) else None
    instance_id = instance_id or getattr(exc, "instance_id", None)  # an item refused unread knows its id
    reason = "; ".join(f"{p.field}: {p.message}" for p in exc.problems) or exc.message
    return Result(label, instance_id, "rejected", reason)


def _unchanged(item: Item, stored: Instance, os_records: OsRecords | None) -> bool:
    if item.os is not None and (os_records is None or not os_unchanged(item.os, stored.os, os_records.cipher)):
        return False
    first = item.metadata or item.userdata
    assert first is not None  # noqa: S101 - parse_item guarantees one part
    if {str(a) for a in first.addresses} != {str(a) for a in stored.addresses}:  # spellings too (kept as sent)
        return False
    if item.metadata is not None and item.metadata.metadata != stored.metadata:
        return False
    return item.userdata is None or item.userdata.userdata == stored.userdata


@dataclass
class Block:
    """A store block held open across batches (a whole import in one transaction).

    ``undo``: what to give back if the block does not commit (the vault's secrets of OS
    writes); ``created``: the ids it created, so a later batch says ``updated`` for them
    (its reads do not see the block's uncommitted writes). ``fresh``: the store held no
    instance when the block began; the block holds the write lock, so until it commits
    the store's reads find none either, and its batches skip them (an import into a new
    database compares nothing).
    """

    tx: WriteTx
    undo: list[Callable[[], None]] = field(default_factory=list)
    created: set[str] = field(default_factory=set)
    fresh: bool = False


async def apply_batch(  # noqa: PLR0913 - the pieces of one batch
    records: Records, store: Store, items: Sequence[Item], *, subject: str, dry_run: bool = False,
    os_records: OsRecords | None = None, notices: NoticeRecords | None = None, block: Block | None = None,
) -> list[Result]:
    """Compare ``items`` with the store and write the ones that change something (unless ``dry_run``).

    Items are applied in order; a later item for the same id sees the earlier one's write.
    An item's ``os`` record is written after the batch's metadata and userdata (``os_records``
    is required for items that carry one); notice items after those (``notices`` is required for them).
    Each batch is one transaction, or part of ``block``'s when given (the caller commits it, or
    undoes it). Notice items are written in transactions of their own: a caller holding a block
    applies them after it committed (the block holds the write lock; see ``imds import``).
    """
    instances = [(index, item) for index, item in enumerate(items) if item.notice is None]
    results = dict(zip((index for index, _ in instances),
                       await _apply_instances(records, store, [item for _, item in instances], subject=subject,
                                              dry_run=dry_run, os_records=os_records, block=block), strict=True))
    for index, item in enumerate(items):
        if item.notice is not None:
            results[index] = await _apply_notice(notices, item, subject=subject, dry_run=dry_run)
    return [results[index] for index in range(len(items))]


async def _apply_notice(notices: NoticeRecords | None, item: Item, *, subject: str, dry_run: bool) -> Result:
    assert item.notice is not None  # noqa: S101 - only called for notice items
    if notices is None:
        return Result(item.label, item.id, "rejected", "notice: notices are not available here")
    notice, acks = item.notice
    outcome = await notices.restore(notice, acks, subject=subject, dry_run=dry_run)
    return Result(item.label, item.id, outcome)  # type: ignore[arg-type]  # restore answers an Outcome


async def _apply_instances(  # noqa: PLR0913 - the pieces of one batch
    records: Records, store: Store, items: Sequence[Item], *, subject: str, dry_run: bool,
    os_records: OsRecords | None, block: Block | None,
) -> list[Result]:
    if not items:
        return []
    stored = {} if block is not None and block.fresh else await store.get_many({item.id for item in items})
    if block is not None:
        stored = {instance_id: found for instance_id, found in stored.items() if instance_id not in block.created}
    results: dict[int, Result] = {}
    pending: list[tuple[int, Item]] = []
    seen: set[str] = set()
    for index, item in enumerate(items):
        before = stored.get(item.id)
        if item.id not in seen and before is not None and _unchanged(item, before, os_records):
            results[index] = Result(item.label, item.id, "unchanged")
        else:
            pending.append((index, item))
        seen.add(item.id)
    if dry_run:
        for index, item in pending:
            results[index] = Result(item.label, item.id, "updated" if item.id in stored else "created")
    elif pending:
        await _write(records, pending, stored.keys(), results, subject=subject, block=block)
        await _write_os(os_records, pending, results, subject=subject, block=block)
    return [results[index] for index in range(len(items))]


async def _write(  # noqa: PLR0913 - the pieces of one batch
    records: Records, pending: list[tuple[int, Item]], stored: Collection[str], results: dict[int, Result], *,
    subject: str, block: Block | None,
) -> None:
    """The metadata and userdata of the items that change something; each one's outcome."""
    pairs = [(item.metadata, item.userdata) for _, item in pending]
    if block is None:
        written = await records.put_many(pairs, subject=subject)
    else:
        written = await records.put_many_in(block.tx, pairs, subject=subject)
    created: set[str] = block.created if block is not None else set()
    for (index, item), result in zip(pending, written, strict=True):
        if not result.applied:
            results[index] = Result(item.label, item.id, "stale", result.reason)
        elif item.id in stored or item.id in created:
            results[index] = Result(item.label, item.id, "updated", warnings=tuple(moved_notes(result.moved)))
        else:
            created.add(item.id)
            results[index] = Result(item.label, item.id, "created", warnings=tuple(moved_notes(result.moved)))


async def _write_os(
    os_records: OsRecords | None, pending: list[tuple[int, Item]], results: dict[int, Result], *, subject: str,
    block: Block | None,
) -> None:
    """The OS records of the written items (a stale OS write makes the item ``stale``)."""
    for index, item in pending:
        if item.os is None or results[index].outcome == "stale":
            continue
        if os_records is None:
            results[index] = Result(item.label, item.id, "rejected", "os: OS records are not available here")
            continue
        if block is None:
            written = await os_records.put(item.os, subject=subject)
        else:
            written, undo = await os_records.put_in(block.tx, item.os, subject=subject)
            block.undo.append(undo)
        if not written.applied:
            results[index] = Result(item.label, item.id, "stale", f"os: {written.reason}")
