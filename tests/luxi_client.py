"""Talking Luxi to ``--ganeti-metad-socket`` in tests: one framed call, ``updateConfig``, a pushed instance."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

from imds.metad.luxi import EOM

IP = "192.0.2.50"


def instance(ip: str = IP, **changes: Any) -> dict[str, Any]:
    """A Ganeti instance as its node daemon sends it (ToDict plus private and secret parameters)."""
    base: dict[str, Any] = {
        "name": "vm1.example.com", "uuid": str(uuid.uuid4()), "os": "debootstrap+default",
        "nics": [{"name": "eth0", "ip": "198.51.100.7"}, {"name": "ganeti:communication:x", "ip": ip}],
        "osparams": {"dhcp": "yes"}, "osparams_private": {"root-hash": "private-value"},
        "osparams_secret": {"root-password": "secret-value"},
    }
    return {**base, **changes}


async def call(path: Path, message: bytes) -> Any:
    """Send one framed message and decode the framed answer."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        writer.write(message + EOM)
        await writer.drain()
        return json.loads((await reader.readuntil(EOM))[:-1])
    finally:
        writer.close()


async def update(path: Path, body: Any) -> Any:
    """``updateConfig(body)``."""
    return await call(path, json.dumps({"method": "updateConfig", "args": [body]}).encode())
