"""Address rows know the network they name: two spellings of one network are one address.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28

``10.70.17.9/31`` and ``10.70.17.8/31`` name one network. The rows are keyed by the address
as sent, so two instances could each hold one spelling, and both then claimed the network
(which one a replica served depended on the order it loaded them). The new ``network``
column (indexed, filled here for every row) lets a write find the other spellings and move
them, as it moves the same spelling.

Compatibility: adds a nullable column and changes none; a replica on an older revision
inserts rows without it (NULL), whose network a newer writer reads from the address
itself. Rows that already share a network stay until one of their instances is written
again (``imds serve`` logs each such pair at start-up: ``catalog.address_shared``).
Downgrading drops the column.
"""

from __future__ import annotations

import ipaddress

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None
_CHUNK = 5000


def _network(address: str) -> str:
    """``imds.models.network_key`` of a stored address, as of this revision."""
    network = ipaddress.ip_network(address, strict=False)
    return f"{network.network_address}/{network.prefixlen}"


def upgrade() -> None:
    with op.batch_alter_table("instance_ip_addresses") as batch:
        batch.add_column(sa.Column("network", sa.String(64), nullable=True))
        batch.create_index(batch.f("ix_instance_ip_addresses_network"), ["network"], unique=False)
    conn = op.get_bind()
    addresses = [row[0] for row in conn.execute(sa.text("SELECT address FROM instance_ip_addresses"))]
    fill = sa.text("UPDATE instance_ip_addresses SET network = :network WHERE address = :address")
    for start in range(0, len(addresses), _CHUNK):
        rows = [{"address": a, "network": _network(a)} for a in addresses[start:start + _CHUNK]]
        conn.execute(fill, rows)


def downgrade() -> None:
    with op.batch_alter_table("instance_ip_addresses") as batch:
        batch.drop_index(batch.f("ix_instance_ip_addresses_network"))
        batch.drop_column("network")
