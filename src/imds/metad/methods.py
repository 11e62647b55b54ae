"""metad's two Luxi methods, ``echo`` and ``updateConfig``, carried out through the admin services.

``updateConfig(instance)`` stores what ``imds.metad.convert`` builds: the metadata record
(address = the communication NIC's IP) and the OS record, in one transaction (both are
stored, or neither is), each parsed by the admin API's own parsers and audited under the
subject ``ganeti-metad``, so replicas learn of it through the same change feed. Its answer
is metad's: ``[]`` (Haskell's unit). Errors are ``InvalidInput``/``ImdsError``; their text
names fields, never a parameter's value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from imds import log
from imds.errors import ImdsError
from imds.metad.convert import convert, refused
from imds.models import MetadataWrite
from imds.services import Services
from imds.services.catalog.addresses import display
from imds.services.ganeti.wire import OsWrite, parse_os_write
from imds.services.records.wire import parse_metadata_write

SUBJECT = "ganeti-metad"
UNIT: list[Any] = []  # what metad answers for a method returning () (Text.JSON encodes unit as [])
_log = log.get("metad")


@dataclass(frozen=True)
class Update:
    """An ``updateConfig`` checked and parsed, ready to be stored (or skipped: no communication NIC)."""

    name: str
    metadata: MetadataWrite | None
    os: OsWrite | None


class Methods:
    """Dispatch of one decoded request to ``echo`` or ``updateConfig``.

    ``prepare`` does the CPU work of a call (metad's checks, the admin API's parsers) and
    touches no shared state, so it runs in a worker thread (``imds.metad.luxi``); ``run``
    stores what it prepared, on the event loop.
    """

    def __init__(self, services: Services) -> None:
        if services.os is None:
            msg = "the Ganeti OS service is not configured"
            raise ImdsError(msg)
        self._services = services
        self._os = services.os

    def prepare(self, method: str, args: list[Any]) -> Update | str:
        """A call checked and parsed: echo's answer, or the update to store; ImdsError when refused."""
        if method == "echo":
            return self._echo(args)
        if method == "updateConfig":
            if len(args) != 1:
                raise refused("RPC input: Unable to read 1 tuple")
            return self._update(args[0])
        raise refused(f"No such method: {method[:64]}")

    async def run(self, prepared: Update | str) -> Any:
        """The result of a prepared call (an update is stored here)."""
        if isinstance(prepared, str):
            return prepared
        return await self._store(prepared)

    @staticmethod
    def _echo(args: list[Any]) -> str:
        if len(args) != 1 or not isinstance(args[0], str):
            raise refused("RPC input: Unable to read 1 tuple of a string")
        return args[0]

    def _update(self, instance: Any) -> Update:
        converted = convert(instance)
        if converted.metadata is None:
            return Update(converted.name, None, None)
        metadata = parse_metadata_write(converted.metadata, self._services.limits)
        os_write = None
        if converted.os is not None:  # parse both before writing either: a refused OS record stores nothing
            os_write = parse_os_write(converted.os, max_value_bytes=self._services.settings.ganeti.os_param_max_bytes)
            self._os.check_definition(os_write)
        return Update(converted.name, metadata, os_write)

    async def _store(self, update: Update) -> list[Any]:
        """The instance and its OS record in one transaction: both are stored, or neither is."""
        metadata, os_write = update.metadata, update.os
        if metadata is None:
            _log.info("metad.skipped", instance=update.name, reason="no communication NIC")
            return UNIT
        undo: Callable[[], None] | None = None
        try:
            async with self._services.store.write() as tx:
                (written,) = await self._services.records.put_many_in(tx, [(metadata, None)], subject=SUBJECT)
                if os_write is not None:
                    _, undo = await self._os.put_in(tx, os_write, subject=SUBJECT)
                else:  # no OS any more: metad replaces the whole entry, so the old parameters go too
                    await self._os.delete_in(tx, metadata.id, subject=SUBJECT)
        except BaseException:
            if undo is not None:
                undo()  # the vault gives back what it held: the record was never stored
            raise
        await self._services.catalog.written(tx.journal)
        if written.moved:  # the communication address was another instance's: never silent
            _log.warning("metad.address_moved", instance=update.name, instance_id=metadata.id,
                         moved={display(a): holder for a, holder in written.moved.items()})
        _log.info("metad.updated", instance=update.name, instance_id=metadata.id, os=os_write is not None)
        return UNIT
