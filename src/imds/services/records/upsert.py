"""Admin writes and reads by id: the rules of the canonical record.

- The address list is the whole truth each time: unlisted addresses are dropped, and an
  address held by another instance moves here (last write wins). Both record types
  share the address table; the instance that loses an address keeps its records.
- A metadata write whose ``updated_at`` is older than the stored document's changes
  nothing, addresses included, and says so (``applied=False``).
- Deleting one record type removes the addresses only when the other is absent too.
- The OpenStack password is set once, by the instance itself (a second set is a
  Conflict), and cleared by an admin; it goes when the instance goes.
- Each write is one all-or-nothing store block; the catalog applies what it wrote
  before the caller hears back, so the next instance read on this replica sees the write.
- Single upserts that arrive at the same moment share one block (``Coalescer``): a few
  statements for the batch instead of several per write. Each still gets its own result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from imds import log
from imds.errors import Conflict, InvalidInput, RecordNotFound, StoreUnavailable
from imds.metrics import Metrics
from imds.models import METADATA, USERDATA, AuditEvent, Instance, MetadataWrite, Network, UserdataWrite, WriteResult
from imds.services.catalog.addresses import display
from imds.services.catalog.catalog import Catalog
from imds.services.identity.proxytrust import inside_trusted
from imds.services.records.audit import delete_event, remove_record, write_event
from imds.services.records.coalesce import Coalescer
from imds.services.records.limits import wide_prefix
from imds.services.records.wire import document_timestamp, moved_notes, notes
from imds.store.interface import Store, WriteTx

_log = log.get("records")
PASSWORD = "password"  # noqa: S105 - a record name, not a secret
PASSWORD_MAX_BYTES = 1020  # Nova's limit: four 255-character chunks of system metadata
UPSERT_BATCH = 256  # concurrent single upserts carried out in one store block at most


@dataclass(frozen=True)
class _Upsert:
    """One upsert: a metadata write, a userdata write or both (same id and addresses), and who asked."""

    metadata: MetadataWrite | None
    userdata: UserdataWrite | None
    subject: str

    @property
    def first(self) -> MetadataWrite | UserdataWrite:
        """The part that names the instance and its addresses (the metadata write, else the userdata one)."""
        first = self.metadata or self.userdata
        assert first is not None  # noqa: S101 - put_many drops empty pairs; single writes have one part
        return first


class Records:
    """Create, replace, read and delete instance records."""

    def __init__(self, store: Store, catalog: Catalog, metrics: Metrics, *, trusted: Sequence[Network] = ()) -> None:
        self._store = store
        self._catalog = catalog
        self._metrics = metrics
        self._trusted = tuple(trusted)  # trusted-proxy networks: binding an address inside one is warned about
        self._upserts = Coalescer(self._upsert_batch, max_batch=UPSERT_BATCH)

    async def put_metadata(self, write: MetadataWrite, *, subject: str) -> WriteResult:
        """Replace the instance's metadata and address list, unless the write is stale."""
        return await self._put_one(METADATA, _Upsert(write, None, subject))

    async def put_userdata(self, write: UserdataWrite, *, subject: str) -> WriteResult:
        """Replace the instance's userdata and address list."""
        return await self._put_one(USERDATA, _Upsert(None, write, subject))

    async def delete(self, kind: str, instance_id: str, *, subject: str) -> None:
        """Delete one record type; raise RecordNotFound when it is absent."""
        other = USERDATA if kind == METADATA else METADATA
        async with self._store.write() as tx:
            if not await tx.remove_record(kind, instance_id):
                raise RecordNotFound(kind, instance_id)
            forgotten = not await tx.has_record(other, instance_id)
            if forgotten:
                await tx.forget_instance(instance_id)
            await tx.mark_changed([instance_id])
            await tx.append_audit(delete_event(subject=subject, instance_id=instance_id, kind=kind,
                                               addresses_removed=forgotten))
        await self._catalog.written(tx.journal)
        self._metrics.deletions.inc()
        _log.info("record.deleted", kind=kind, instance_id=instance_id, subject=subject, addresses_removed=forgotten)

    async def get(self, kind: str, instance_id: str) -> Instance:
        """The stored instance, if it has a record of ``kind``; else RecordNotFound."""
        instance = await self._store.get(instance_id)
        record = None if instance is None else (instance.metadata if kind == METADATA else instance.userdata)
        if instance is None or record is None:
            raise RecordNotFound(kind, instance_id)
        return instance

    async def _put_one(self, kind: str, upsert: _Upsert) -> WriteResult:
        """One upsert, carried out in a batch with those that arrive at the same moment."""
        try:
            result = await self._upserts.submit(upsert)
        except StoreUnavailable:
            self._metrics.store_errors[kind].inc()
            raise
        if result.applied:
            self._metrics.inserts[kind].inc()
        _log.info(
            "record.written",
            kind=kind,
            instance_id=result.instance_id,
            subject=upsert.subject,
            applied=result.applied,
            reason=result.reason,
            addresses=len(result.addresses),
            moved={display(a): held_by for a, held_by in result.moved.items()},
            dropped=[display(a) for a in result.dropped],
        )
        # hollow's readings the write relied on, said in its answer
        readings = {note.text for note in notes(upsert.first)}
        if readings:
            _log.info("record.hollow_readings", instance_id=result.instance_id, notes=sorted(readings))
        if wide := [display(a) for a in result.addresses if wide_prefix(a) is not None]:
            _log.warning("record.wide_prefix", instance_id=result.instance_id, addresses=wide)
        if trusted := [warning for warning in result.warnings if warning not in readings]:
            _log.warning("record.inside_trusted_proxy", instance_id=result.instance_id, problems=trusted)
        return result

    # --- many upserts in one transaction (imds import) ---------------------------------------

    async def put_many(
        self, items: Sequence[tuple[MetadataWrite | None, UserdataWrite | None]], *, subject: str
    ) -> list[WriteResult]:
        """Apply each (metadata, userdata) pair by the rules above, all in one transaction.

        Per item: a stale metadata write changes nothing for that item (``applied=False``,
        addresses included); otherwise the given parts are replaced and the address list
        (taken from the metadata write, else the userdata write) becomes the whole truth.
        Items apply in order (a later item sees an earlier one's write). The store's batch
        forms keep this to a few statements per batch; one log line for the batch.
        """
        upserts = [_Upsert(m, u, subject) for m, u in items if m is not None or u is not None]
        return self._counted(upserts, await self._upsert_batch(upserts), subject)

    async def put_many_in(
        self, tx: WriteTx, items: Sequence[tuple[MetadataWrite | None, UserdataWrite | None]], *, subject: str,
    ) -> list[WriteResult]:
        """``put_many`` inside a store block the caller holds open (several batches, one transaction).

        The caller hands the block's journal to the catalog once it has committed.
        """
        upserts = [_Upsert(m, u, subject) for m, u in items if m is not None or u is not None]
        return self._counted(upserts, await self._apply(tx, upserts), subject)

    def _counted(self, upserts: Sequence[_Upsert], results: list[WriteResult], subject: str) -> list[WriteResult]:
        applied = [u for u, r in zip(upserts, results, strict=True) if r.applied]
        self._metrics.inserts[METADATA].inc(sum(u.metadata is not None for u in applied))
        self._metrics.inserts[USERDATA].inc(sum(u.userdata is not None for u in applied))
        _log.info("records.written", subject=subject, items=len(upserts),
                  applied=len(applied), stale=len(results) - len(applied))
        return results

    async def _upsert_batch(self, upserts: Sequence[_Upsert]) -> list[WriteResult]:
        """Carry out upserts in one store block, in order; one result each. The catalog has them on return."""
        async with self._store.write() as tx:
            results = await self._apply(tx, upserts)
        await self._catalog.written(tx.journal)
        return results

    async def _apply(self, tx: WriteTx, upserts: Sequence[_Upsert]) -> list[WriteResult]:
        """Carry out upserts in ``tx``, in order; one result each."""
        results: list[WriteResult | None] = []
        applied: list[tuple[int, _Upsert, MetadataWrite | UserdataWrite]] = []
        events: list[AuditEvent] = []
        documents = await tx.metadata_of_many([u.metadata.id for u in upserts if u.metadata is not None])
        for upsert in upserts:
            first = upsert.first
            reason = None if upsert.metadata is None else _staleness(
                documents.get(first.id), upsert.metadata.metadata)
            if reason is not None:
                results.append(WriteResult(first.id, applied=False, reason=reason))
                events.append(write_event(subject=upsert.subject, instance_id=first.id, kind=METADATA,
                                          reason=reason))
                continue
            if upsert.metadata is not None:
                documents[first.id] = upsert.metadata.metadata
            applied.append((len(results), upsert, first))
            results.append(None)
        await tx.put_records(
            [(u.metadata.id, u.metadata.metadata) for _, u, _ in applied if u.metadata is not None],
            [(u.userdata.id, u.userdata.userdata) for _, u, _ in applied if u.userdata is not None],
        )
        changes = await tx.replace_addresses_many([(first.id, first.addresses) for _, _, first in applied])
        for (index, upsert, first), (moved, dropped) in zip(applied, changes, strict=True):
            await tx.mark_changed([first.id, *moved.values()])  # one feed block per write, in order
            results[index] = WriteResult(first.id, applied=True, addresses=first.addresses, moved=moved,
                                         dropped=dropped,
                                         warnings=(*(note.text for note in notes(first)),
                                                   *inside_trusted(first.addresses, self._trusted),
                                                   *moved_notes(moved)))
            # One entry per record written, as two single writes would make (the second moves nothing).
            kinds = [kind for kind, part in ((METADATA, upsert.metadata), (USERDATA, upsert.userdata)) if part]
            events += [
                write_event(subject=upsert.subject, instance_id=first.id, kind=kind, addresses=first.addresses,
                            moved=moved if n == 0 else None, dropped=dropped if n == 0 else ())
                for n, kind in enumerate(kinds)
            ]
        await tx.append_audit_many(events)
        return [result for result in results if result is not None]

    # --- the OpenStack password: written by the instance once, cleared by an admin ---------

    async def set_password(self, instance_id: str, password: bytes) -> None:
        """Store the password the instance posted; Conflict when one is already set.

        One transaction that checks and writes, so two replicas racing on the same
        instance store exactly one password.
        """
        if not password:
            raise InvalidInput.one("body", "is empty: post the (encrypted) password")
        if len(password) > PASSWORD_MAX_BYTES:
            raise InvalidInput.one("body", f"a password is at most {PASSWORD_MAX_BYTES} bytes")
        async with self._store.write() as tx:
            if not (await tx.has_record(METADATA, instance_id) or await tx.has_record(USERDATA, instance_id)):
                raise RecordNotFound(METADATA, instance_id)
            if not await tx.put_password(instance_id, password):
                raise Conflict(f"instance {instance_id} already has a password; an admin must clear it first")
            await tx.mark_changed([instance_id])
        await self._catalog.written(tx.journal)
        _log.info("password.set", instance_id=instance_id, size=len(password))

    async def clear_password(self, instance_id: str, *, subject: str) -> None:
        """Delete the instance's password; RecordNotFound when it has none."""
        journal = await remove_record(self._store, instance_id, PASSWORD, lambda tx: tx.remove_password(instance_id),
                                      subject=subject)
        await self._catalog.written(journal)
        _log.info("password.cleared", instance_id=instance_id, subject=subject)


def _staleness(stored: dict[str, object] | None, incoming: dict[str, object]) -> str | None:
    """Why an incoming document is stale, or None when it may be applied."""
    if stored is None:
        return None
    old, new = document_timestamp(stored), document_timestamp(incoming)
    if old is None or new is None or new >= old:
        return None
    return f"stale: updated_at {incoming['updated_at']} is older than the stored {stored['updated_at']}"
