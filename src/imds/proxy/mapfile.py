"""``--map FILE``: the source address → instance table of an isolated tenant network.

The file is JSON, an object keyed by the VM's IP address (IPv4 or IPv6)::

    {"10.0.0.5": "5f1c9a52-…",
     "10.0.0.6": {"instance_id": "7d2e…", "tenant_id": "project-a"}}

or plain lines, ``ADDRESS INSTANCE_ID [TENANT_ID]``, with ``#`` comments and blank lines.
It is re-read on SIGHUP and whenever its modification time or size changes (polled); a file
that fails to parse is logged and the previous table is kept, so a half-written file never
empties the proxy. Write it atomically (write a temp file, then rename) all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import signal
from pathlib import Path
from typing import Any

from imds import log
from imds.errors import ConfigError
from imds.models import Address
from imds.proxy.identify import Identity

_log = log.get("proxy.map")


def parse_map(text: str, source: str = "map") -> dict[Address, Identity]:
    """The table in ``text`` (JSON object or lines); ConfigError naming the bad entry."""
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            msg = f"{source}: invalid JSON: {exc}"
            raise ConfigError(msg) from exc
        return {_address(key, source): _identity(value, key, source) for key, value in data.items()}
    table: dict[Address, Identity] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) not in (2, 3):
            msg = f"{source}:{number}: expected ADDRESS INSTANCE_ID [TENANT_ID]"
            raise ConfigError(msg)
        table[_address(fields[0], f"{source}:{number}")] = Identity(*fields[1:])
    return table


def _address(text: str, where: str) -> Address:
    try:
        address = ipaddress.ip_address(text.strip().split("%", 1)[0])
    except ValueError as exc:
        msg = f"{where}: {text!r} is not an IP address"
        raise ConfigError(msg) from exc
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _identity(value: Any, key: str, source: str) -> Identity:
    if isinstance(value, str) and value.strip():
        return Identity(value.strip())
    if isinstance(value, dict) and isinstance(value.get("instance_id"), str) and value["instance_id"].strip():
        tenant = value.get("tenant_id")
        if tenant is not None and not isinstance(tenant, str):
            msg = f"{source}: {key}: tenant_id must be a string"
            raise ConfigError(msg)
        return Identity(value["instance_id"].strip(), tenant or None)
    msg = f'{source}: {key}: expected an instance id or {{"instance_id": …, "tenant_id": …}}'
    raise ConfigError(msg)


class MapIdentifier:
    """An ``Identifier`` answering from a map file, reloaded on SIGHUP and on change."""

    def __init__(self, path: Path, *, poll_interval: float = 2.0, reload_on_sighup: bool = False) -> None:
        self.path = path
        self._poll_interval = poll_interval
        self._sighup = reload_on_sighup
        self._table: dict[Address, Identity] = {}
        self._stamp: tuple[int, int] | None = None
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._table)

    async def start(self) -> None:
        """Load the file (a bad file is a ConfigError here) and start watching it."""
        self._load()
        if self._sighup:
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reload)
        if self._poll_interval > 0:
            self._task = asyncio.create_task(self._watch(), name="imds-proxy-map-watch")

    async def stop(self) -> None:
        """Stop watching."""
        if self._sighup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def identify(self, peer: Address) -> Identity | None:
        """The instance mapped to ``peer``, or None."""
        return self._table.get(peer)

    def reload(self) -> bool:
        """Re-read the file now; on error keep the previous table. Whether the new one took."""
        try:
            self._load()
        except ConfigError as exc:
            _log.error("proxy.map_invalid", path=str(self.path), error=exc.message, kept=len(self._table))
            return False
        return True

    def _load(self) -> None:
        try:
            stat = self.path.stat()
            text = self.path.read_text()
        except OSError as exc:
            msg = f"--map {self.path}: cannot read: {exc.strerror}"
            raise ConfigError(msg) from exc
        self._stamp = (stat.st_mtime_ns, stat.st_size)
        self._table = parse_map(text, str(self.path))
        _log.info("proxy.map_loaded", path=str(self.path), entries=len(self._table))

    def _changed(self) -> bool:
        try:
            stat = self.path.stat()
        except OSError:
            return False
        return (stat.st_mtime_ns, stat.st_size) != self._stamp

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._poll_interval)
            if self._changed():
                self.reload()
