"""Test data: unique ids and addresses drawn from sequences, and request bodies."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

_v4 = itertools.count(1)
_v6 = itertools.count(1)


def new_id() -> str:
    """A fresh instance id."""
    return str(uuid.uuid4())


def next_ipv4() -> str:
    """A fresh IPv4 host address in 10.0.0.0/8, never repeated within a test run."""
    n = next(_v4)
    return f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"


def next_ipv6() -> str:
    """A fresh IPv6 host address in fd00::/8."""
    return f"fd00::{next(_v6):x}"


def metadata_body(instance_id: str | None = None, ips: list[str] | None = None, **document: Any) -> dict[str, Any]:
    """A POST /device-metadata body; the document gets ``id`` and ``hostname`` unless given."""
    instance_id = instance_id or new_id()
    doc = {"id": instance_id, "hostname": f"host-{instance_id[:8]}", **document}
    return {"id": instance_id, "ipAddresses": ips if ips is not None else [next_ipv4()], "metadata": doc}


def userdata_body(
    instance_id: str, ips: list[str], userdata: str = "#!/bin/sh\necho hi\n", **extra: Any
) -> dict[str, Any]:
    """A POST /device-userdata body."""
    return {"id": instance_id, "ipAddresses": ips, "userdata": userdata, **extra}
