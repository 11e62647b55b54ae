"""A hollow-metadataservice database filled with a generated fleet, for ``imds import --from-hollow``.

The schema is hollow's own (``tests/fixtures/hollow/schema.sql``, from its goose migrations).
``instance(n)`` is the n-th instance, the same every time, so a test or a benchmark can
check what imds stored against what it generated. Every 10 instances hold each kind:

- n % 10 in 0..6: metadata and text userdata (a cloud-config);
- n % 10 == 7: metadata and gzip-compressed userdata (bytes that are not UTF-8);
- n % 10 == 8: metadata only;
- n % 10 == 9: userdata only, raw bytes (0x00 to 0xff), or NULL when n % 100 == 9
  (hollow serves NULL as empty userdata).

Each has an IPv4 host address; one in three an IPv6 host as well; n % 25 == 1 an IPv4
address in interface notation (``100.64.x.y/31``: a host with its prefix) and n % 25 == 2
an IPv6 one (``2604:1380:4641:1f00::…/127``), each in a network no other instance uses.
"""

from __future__ import annotations

import gzip
import ipaddress
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SCHEMA = Path(__file__).parent / "fixtures" / "hollow" / "schema.sql"
STAMP = datetime(2026, 11, 1, tzinfo=UTC)
V6_HOSTS = ipaddress.IPv6Address("2604:1380:4641:1f01::")
V6_INTERFACES = ipaddress.IPv6Address("2604:1380:4641:1f00::")


@dataclass(frozen=True)
class HollowInstance:
    """One generated instance as hollow stores it (``userdata`` None with ``has_userdata``: a NULL row)."""

    id: str
    addresses: tuple[str, ...]
    metadata: dict[str, Any] | None
    has_userdata: bool
    userdata: bytes | None

    @property
    def interface_notation(self) -> bool:
        """Whether one of its addresses is a host written with a shorter prefix (``10.70.17.9/31``)."""
        return any("/" in a for a in self.addresses)


def instance(n: int) -> HollowInstance:
    """The n-th generated instance (ids and addresses unique up to 2,000,000)."""
    instance_id = str(uuid.UUID(int=(0x40110 << 96) + n + 1, version=4))
    addresses = [f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"]
    if n % 3 == 0:
        addresses.append(str(V6_HOSTS + n))
    if n % 25 == 1:
        addresses.append(f"100.{64 + (n >> 15)}.{(n >> 7) & 255}.{(n & 127) * 2 + 1}/31")
    if n % 25 == 2:
        addresses.append(f"{V6_INTERFACES + 4 * n + 1}/127")
    kind = n % 10
    metadata = None if kind == 9 else {
        "id": instance_id, "hostname": f"node-{n}", "facility": "da11", "plan": "c3.small.x86",
        "description": "café ☃ — generated", "tags": ["role=worker", f"rack={n % 40}"],
        "network": {"addresses": [{"address": addresses[0], "public": False, "address_family": 4, "cidr": 31}]},
    }
    text = f"#cloud-config\nhostname: node-{n}\n".encode()
    userdata: bytes | None
    if kind <= 6:
        userdata = text
    elif kind == 7:
        userdata = gzip.compress(text, mtime=0)
    elif kind == 8:
        userdata = None
    else:
        userdata = None if n % 100 == 9 else bytes([n & 255, 0, 255]) + bytes(range(256))
    return HollowInstance(instance_id, tuple(addresses), metadata, kind != 8, userdata)


async def create_hollow(conn: Any, count: int) -> None:
    """Create hollow's tables on ``conn`` (an asyncpg connection) and COPY ``count`` instances in."""
    await conn.execute(SCHEMA.read_text())
    fleet = [instance(n) for n in range(count)]
    await conn.copy_records_to_table(
        "instance_metadata", columns=["id", "metadata", "created_at", "updated_at"],
        records=[(uuid.UUID(i.id), json.dumps(i.metadata), STAMP, STAMP) for i in fleet if i.metadata is not None],
    )
    await conn.copy_records_to_table(
        "instance_userdata", columns=["id", "userdata", "created_at", "updated_at"],
        records=[(uuid.UUID(i.id), i.userdata, STAMP, STAMP) for i in fleet if i.has_userdata],
    )
    await conn.copy_records_to_table(
        "instance_ip_addresses", columns=["instance_id", "address", "created_at", "updated_at"],
        records=[(uuid.UUID(i.id), ipaddress.ip_interface(a), STAMP, STAMP) for i in fleet for a in i.addresses],
    )
