"""metad's two Luxi methods, ``echo`` and ``updateConfig``, carried out through the admin services.

``updateConfig(instance)`` stores what ``imds.metad.convert`` builds: the metadata record
(address = the communication NIC's IP) with ``Records.put_metadata``, then the OS record
with ``OsRecords.put``, each parsed by the admin API's own parsers and audited under the
subject ``ganeti-metad``, so replicas learn of it through the same change feed. Its answer
is metad's: ``[]`` (Haskell's unit). Errors are ``InvalidInput``/``ImdsError``; their text
names fields, never a parameter's value.
"""

from __future__ import annotations

import contextlib
from typing import Any

from imds import log
from imds.errors import ImdsError, RecordNotFound
from imds.metad.convert import convert, refused
from imds.services import Services
from imds.services.ganeti.wire import parse_os_write
from imds.services.records.wire import parse_metadata_write

SUBJECT = "ganeti-metad"
UNIT: list[Any] = []  # what metad answers for a method returning () (Text.JSON encodes unit as [])
_log = log.get("metad")


class Methods:
    """Dispatch of one decoded request to ``echo`` or ``updateConfig``."""

    def __init__(self, services: Services) -> None:
        if services.os is None:
            msg = "the Ganeti OS service is not configured"
            raise ImdsError(msg)
        self._services = services
        self._os = services.os

    async def call(self, method: str, args: list[Any]) -> Any:
        """The method's result; ImdsError with metad's message when the call is refused."""
        if method == "echo":
            return self._echo(args)
        if method == "updateConfig":
            if len(args) != 1:
                raise refused("RPC input: Unable to read 1 tuple")
            return await self.update_config(args[0])
        raise refused(f"No such method: {method[:64]}")

    @staticmethod
    def _echo(args: list[Any]) -> str:
        if len(args) != 1 or not isinstance(args[0], str):
            raise refused("RPC input: Unable to read 1 tuple of a string")
        return args[0]

    async def update_config(self, instance: Any) -> list[Any]:
        """Store the instance (skipped without a communication NIC, as metad does)."""
        converted = convert(instance)
        if converted.metadata is None:
            _log.info("metad.skipped", instance=converted.name, reason="no communication NIC")
            return UNIT
        settings = self._services.settings
        metadata = parse_metadata_write(converted.metadata, self._services.limits)
        os_write = None
        if converted.os is not None:  # parse both before writing either: a refused OS record stores nothing
            os_write = parse_os_write(converted.os, max_value_bytes=settings.ganeti.os_param_max_bytes)
            self._os.check_definition(os_write)
        await self._services.records.put_metadata(metadata, subject=SUBJECT)
        if os_write is not None:
            await self._os.put(os_write, subject=SUBJECT)
        else:  # no OS any more: metad replaces the whole entry, so the old parameters go too
            with contextlib.suppress(RecordNotFound):
                await self._os.delete(metadata.id, subject=SUBJECT)
        _log.info("metad.updated", instance=converted.name, instance_id=metadata.id, os=os_write is not None)
        return UNIT
