"""The Ganeti OS record of an instance: admin writes and reads, and what the instance is served.

- A write replaces the whole record (Ganeti's rule: a secret the write omits is gone);
  a body ``updated_at`` older than the stored one changes nothing (``applied: false``).
- The instance must already have a metadata or userdata record: the OS record has no
  addresses of its own, and it goes when the instance goes.
- ``public`` values are stored and shown; ``private`` values are stored (Fernet-encrypted
  with ``--private-key-file``), served to the instance only, and shown as ``<private>``;
  ``secret`` values and package credentials stay in this process's ``SecretVault`` under
  the write's generation. A replica without them serves the parameter as absent, and the
  admin read says ``"secret_state": "lost"`` (``held`` where it has them).
- While the mode is ``install``/``self_install``, ``install_parameters`` are served on top
  of ``parameters`` (same name: the install value wins); in ``run`` mode only
  ``parameters``. Nothing is served unless the mode is an install mode or
  ``communication`` is on.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from imds import log
from imds.errors import InvalidInput, NotFound, Problem, RecordNotFound
from imds.models import METADATA, PRIVATE, PUBLIC, SECRET, USERDATA, Instance, OsRecord, StoredParam
from imds.services.catalog.catalog import Catalog
from imds.services.ganeti.crypto import PrivateCipher
from imds.services.ganeti.definitions import OsDefinitions
from imds.services.ganeti.environment import environment, render
from imds.services.ganeti.memory import HELD, LOST, Held, PackageAuth, Secret, SecretVault
from imds.services.ganeti.wire import SECTIONS, OsWrite, ParamIn
from imds.services.records.audit import delete_event, write_event
from imds.store.interface import Store, WriteTx

_log = log.get("os")
OS_RECORD = "os"
INSTALL_MODES = frozenset({"install", "self_install"})
RUN = "run"
SHOWN_PRIVATE = "<private>"


@dataclass(frozen=True)
class OsWriteResult:
    """What a write did; ``reason`` says why it was not applied."""

    instance_id: str
    applied: bool
    reason: str | None = None


def active(record: OsRecord | None) -> bool:
    """Whether the instance may read its Ganeti paths now."""
    return record is not None and (record.mode in INSTALL_MODES or record.communication)


class OsRecords:
    """Create, replace, read and delete OS records; render what the instance is served."""

    def __init__(
        self, store: Store, catalog: Catalog, *, cipher: PrivateCipher, definitions: OsDefinitions,
        vault: SecretVault | None = None,
    ) -> None:
        self._store = store
        self._catalog = catalog
        self.cipher = cipher
        self.definitions = definitions
        self.vault = vault or SecretVault()

    def __repr__(self) -> str:
        return f"OsRecords({self.vault!r}, {self.cipher!r})"

    # --- admin side -----------------------------------------------------------------------

    async def put(self, write: OsWrite, *, subject: str) -> OsWriteResult:
        """Replace the instance's OS record unless the write is stale."""
        undo: Callable[[], None] | None = None
        try:
            async with self._store.write() as tx:
                result, undo = await self.put_in(tx, write, subject=subject)
        except BaseException:
            if undo is not None:
                undo()
            raise
        if result.applied:
            await self._catalog.written(tx.journal)
        return result

    async def put_in(self, tx: WriteTx, write: OsWrite, *, subject: str) -> tuple[OsWriteResult, Callable[[], None]]:
        """``put`` inside a store block the caller holds open; the result, and ``undo`` for a block that fails.

        The write's secrets are in the vault from here on (before the commit, so no read sees
        the record without them); ``undo`` gives the vault back what it held, and the caller
        calls it when the block does not commit. The caller hands the block's journal to the
        catalog once it has committed.
        """
        self.check_definition(write)
        generation = uuid.uuid4().hex
        record, held = self._split(write, generation)
        previous = self.vault.keep(write.id, held)

        def undo() -> None:
            self.vault.restore(write.id, previous)

        try:
            reason = await self._apply(tx, write, record, subject)
        except BaseException:
            undo()
            raise
        if reason is not None:
            undo()
        _log.info(
            "os.written", instance_id=write.id, subject=subject, applied=reason is None, reason=reason,
            os_type=write.os_type, mode=write.mode, communication=write.communication,
            **{s: _counts(getattr(write, s)) for s in SECTIONS}, package=write.package_url is not None,
        )
        return OsWriteResult(write.id, applied=reason is None, reason=reason), undo

    @staticmethod
    async def _apply(tx: WriteTx, write: OsWrite, record: OsRecord, subject: str) -> str | None:
        """Store the record in ``tx`` (with its audit entry); the reason it is stale, or None once stored."""
        if not (await tx.has_record(METADATA, write.id) or await tx.has_record(USERDATA, write.id)):
            raise _no_instance(write.id)
        reason = _staleness(await tx.os_of(write.id), write)
        if reason is None:
            await tx.put_os(write.id, record)
            await tx.mark_changed([write.id])
        # Facts only: the OS, the mode and how many parameters of each visibility, never a value.
        facts = {"os_type": write.os_type, "mode": write.mode,
                 **{section: _counts(getattr(write, section)) for section in SECTIONS}}
        await tx.append_audit(write_event(subject=subject, instance_id=write.id, kind=OS_RECORD, reason=reason,
                                          facts=facts))
        return reason

    async def end_install(self, instance_id: str, *, subject: str, why: str) -> str | None:
        """Switch an installing record to mode ``run`` (same generation: its secrets stay); the mode it left, or None.

        One durable transaction with its audit entry (``why``: what ended it); the change
        feed carries it to the other replicas. None (nothing written) when the instance has no
        OS record or its mode is not an install mode.
        """
        async with self._store.write() as tx:
            record = await tx.os_of(instance_id)
            if record is None or record.mode not in INSTALL_MODES:
                return None
            await tx.put_os(instance_id, replace(record, mode=RUN))
            await tx.mark_changed([instance_id])
            await tx.append_audit(write_event(subject=subject, instance_id=instance_id, kind=OS_RECORD,
                                              facts={"os_type": record.os_type, "mode": RUN, "from": record.mode,
                                                     "why": why}))
        await self._catalog.written(tx.journal)
        _log.info("os.install_ended", instance_id=instance_id, subject=subject, left=record.mode, why=why)
        return record.mode

    async def view(self, instance_id: str) -> dict[str, Any]:
        """The admin's view: public values, ``<private>``, and per secret ``held``/``lost``."""
        instance = await self._store.get(instance_id)
        if instance is None or instance.os is None:
            raise RecordNotFound(OS_RECORD, instance_id)
        record = instance.os
        held = self.vault.current(instance_id, record.generation)
        body: dict[str, Any] = {
            "id": instance_id,
            "os_type": record.os_type,
            "mode": record.mode,
            "communication": record.communication,
            "served": active(record),
        }
        if record.updated_at is not None:
            body["updated_at"] = record.updated_at.isoformat()
        for section in SECTIONS:
            body[section] = {
                name: _shown(param, held is not None and (section, name) in held.values)
                for name, param in getattr(record, section).items()
            }
        if record.package_url is not None:
            package: dict[str, Any] = {"url": record.package_url}
            if record.package_auth:
                package["credentials_state"] = HELD if held is not None and held.package_auth else LOST
            body["package"] = package
        return body

    async def delete(self, instance_id: str, *, subject: str) -> None:
        """Delete the OS record (and forget its secrets); RecordNotFound when absent."""
        async with self._store.write() as tx:
            if not await self.delete_in(tx, instance_id, subject=subject):
                raise RecordNotFound(OS_RECORD, instance_id)
        self.vault.drop(instance_id)
        await self._catalog.written(tx.journal)

    async def delete_in(self, tx: WriteTx, instance_id: str, *, subject: str) -> bool:
        """``delete`` inside a store block the caller holds open; False (nothing done) when there is no record.

        The vault forgets the record's secrets when the catalog sees it gone (``Catalog.on_os_gone``).
        """
        if not await tx.remove_os(instance_id):
            return False
        await tx.mark_changed([instance_id])
        await tx.append_audit(delete_event(subject=subject, instance_id=instance_id, kind=OS_RECORD))
        _log.info("os.deleted", instance_id=instance_id, subject=subject)
        return True

    # --- instance side --------------------------------------------------------------------

    def served(self, instance: Instance) -> dict[str, tuple[str, str]]:
        """Each parameter → (value, visibility) as the instance is served them: public, then private, then secret."""
        record = instance.os
        if record is None:
            return {}
        held = self.vault.current(instance.id, record.generation)
        opened = self._opened(instance)
        merged: dict[str, tuple[str, str, str]] = {}  # name → (section, visibility, value)
        for section, params in _sections(record):
            for name, param in params.items():
                value = self._value(section, name, param, held, opened)
                if value is None:
                    merged.pop(name, None)
                else:
                    merged[name] = (section, param.visibility, value)
        return {
            name: (value, visibility)
            for wanted in (PUBLIC, PRIVATE, SECRET)
            for name, (_section, visibility, value) in merged.items()
            if visibility == wanted
        }

    def parameters_json(self, instance: Instance) -> bytes:
        """Ganeti metad's ``parameters.json``: ``{name: [value, visibility]}``, public then private then secret."""
        ordered = {name: [value, visibility] for name, (value, visibility) in self.served(instance).items()}
        return json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()

    def environment(self, instance: Instance) -> bytes:
        """The OS scripts' environment (``imds.services.ganeti.environment``) as ``KEY=value`` lines."""
        record = instance.os
        if record is None:
            return b""
        env = environment(
            instance_id=instance.id, os_type=record.os_type, document=instance.metadata,
            definition=self.definitions.get(record.os_type),
            parameters={name: value for name, (value, _visibility) in self.served(instance).items()},
        )
        return render(env)

    def package_auth(self, instance: Instance) -> PackageAuth | None:
        """The package credentials this replica holds for the instance's current record."""
        record = instance.os
        if record is None:
            return None
        held = self.vault.current(instance.id, record.generation)
        return held.package_auth if held is not None else None

    # --- helpers --------------------------------------------------------------------------

    def _opened(self, instance: Instance) -> dict[tuple[str, str], str | None]:
        """The private values in clear, decrypted once per catalog version of the instance (in memory only)."""
        entry = self._catalog.get(instance.id)
        if entry is not None and entry.instance is instance:
            return entry.render(PRIVATE_RENDER, self._open_private)
        return self._open_private(instance)

    def _open_private(self, instance: Instance) -> dict[tuple[str, str], str | None]:
        opened: dict[tuple[str, str], str | None] = {}
        for section, params in _sections(instance.os) if instance.os is not None else ():
            for name, param in params.items():
                if param.visibility == PRIVATE and param.value is not None:
                    clear = opened[section, name] = self.cipher.open(param.value, encrypted=param.encrypted)
                    if clear is None:
                        _log.error("os.private_unreadable", instance_id=instance.id, parameter=name,
                                   hint="no key in --private-key-file opens it")
        return opened

    @staticmethod
    def _value(section: str, name: str, param: StoredParam, held: Held | None,
               opened: dict[tuple[str, str], str | None]) -> str | None:
        if param.visibility == SECRET:
            secret = held.values.get((section, name)) if held is not None else None
            return secret.reveal() if secret is not None else None
        if param.value is None:
            return None
        if param.visibility == PRIVATE:
            return opened.get((section, name))
        return param.value

    def _split(self, write: OsWrite, generation: str) -> tuple[OsRecord, Held]:
        """The stored record (no secret values) and the secrets to hold in memory."""
        secrets: dict[tuple[str, str], Secret] = {}
        stored: dict[str, dict[str, StoredParam]] = {}
        for section in SECTIONS:
            params: dict[str, ParamIn] = getattr(write, section)
            stored[section] = {}
            for name, param in params.items():
                value = param.value
                if param.visibility == SECRET:
                    assert isinstance(value, Secret)  # noqa: S101 - os_wire wraps every non-public value
                    secrets[(section, name)] = value
                    stored[section][name] = StoredParam(SECRET)
                elif param.visibility == PRIVATE:
                    assert isinstance(value, Secret)  # noqa: S101 - os_wire wraps every non-public value
                    sealed, encrypted = self.cipher.seal(value.reveal())
                    stored[section][name] = StoredParam(PRIVATE, sealed, encrypted)
                else:
                    stored[section][name] = StoredParam(PUBLIC, str(value))
        record = OsRecord(
            os_type=write.os_type, mode=write.mode, communication=write.communication,
            parameters=stored["parameters"], install_parameters=stored["install_parameters"],
            package_url=write.package_url, package_auth=write.package_auth is not None,
            generation=generation, updated_at=write.updated_at,
        )
        return record, Held(generation, secrets, write.package_auth)

    def check_definition(self, write: OsWrite) -> None:
        """With definitions loaded, the OS type must be one, and parameters must be declared."""
        if not len(self.definitions):
            return
        definition = self.definitions.get(write.os_type)
        if definition is None:
            raise InvalidInput.one("os_type", f"no such OS definition; known: {', '.join(self.definitions.names())}")
        if not definition.parameters:
            return
        problems = [
            Problem(f"{section}.{name}", f"is not declared in {definition.name}/parameters.list")
            for section in SECTIONS
            for name in getattr(write, section)
            if name not in definition.parameters
        ]
        if problems:
            raise InvalidInput(problems)


def _no_instance(instance_id: str) -> NotFound:
    return NotFound(
        f"instance {instance_id} has no metadata or userdata record: post /device-metadata first "
        "(the OS record has no addresses of its own)"
    )


def _shown(param: StoredParam, held: bool) -> dict[str, Any]:
    if param.visibility == PUBLIC:
        return {"visibility": PUBLIC, "value": param.value}
    if param.visibility == PRIVATE:
        return {"visibility": PRIVATE, "value": SHOWN_PRIVATE}
    return {"visibility": SECRET, "secret_state": HELD if held else LOST}


def _counts(params: dict[str, ParamIn]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for param in params.values():
        counts[param.visibility] = counts.get(param.visibility, 0) + 1
    return counts


def _staleness(stored: OsRecord | None, write: OsWrite) -> str | None:
    if stored is None or stored.updated_at is None or write.updated_at is None:
        return None
    if write.updated_at >= stored.updated_at:
        return None
    return f"stale: updated_at {write.updated_at.isoformat()} is older than the stored {stored.updated_at.isoformat()}"


PRIVATE_RENDER = "ganeti.private"  # Entry.render key: the record's private values, opened


def _sections(record: OsRecord) -> list[tuple[str, dict[str, StoredParam]]]:
    """The parameter sections served: install_parameters (merged over parameters) only while installing."""
    sections = [("parameters", record.parameters)]
    if record.mode in INSTALL_MODES:
        sections.append(("install_parameters", record.install_parameters))
    return sections
