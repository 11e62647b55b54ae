"""Initial schema: instances, metadata, userdata, addresses, change feed.

Revision ID: 0001
Revises:
Create Date: 2026-11-23

Compatibility: first revision.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from imds.store.sql.migrations.shapes import create_one_per_instance

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_ID = sa.String(36)
_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "instances",
        sa.Column("id", _ID, nullable=False),
        sa.Column("created_at", _TS, server_default=sa.func.current_timestamp(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instances")),
    )
    create_one_per_instance("instance_metadata", "document", sa.JSON(none_as_null=True))
    create_one_per_instance("instance_userdata", "userdata", sa.LargeBinary())
    op.create_table(
        "instance_ip_addresses",
        sa.Column("address", sa.String(64), nullable=False),
        sa.Column("instance_id", _ID, nullable=False),
        sa.Column("created_at", _TS, server_default=sa.func.current_timestamp(), nullable=False),
        sa.ForeignKeyConstraint(
            ["instance_id"], ["instances.id"], name=op.f("fk_instance_ip_addresses_instance_id_instances"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("address", name=op.f("pk_instance_ip_addresses")),
    )
    op.create_index(
        op.f("ix_instance_ip_addresses_instance_id"), "instance_ip_addresses", ["instance_id"], unique=False
    )
    op.create_table(
        "changes",
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("instance_id", _ID, nullable=False),
        sa.Column("changed_at", _TS, server_default=sa.func.current_timestamp(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_changes")),
    )
    feed_head = op.create_table(
        "feed_head",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_feed_head")),
    )
    op.bulk_insert(feed_head, [{"id": 1, "seq": 0}])


def downgrade() -> None:
    op.drop_table("feed_head")
    op.drop_table("changes")
    op.drop_index(op.f("ix_instance_ip_addresses_instance_id"), table_name="instance_ip_addresses")
    op.drop_table("instance_ip_addresses")
    op.drop_table("instance_userdata")
    op.drop_table("instance_metadata")
    op.drop_table("instances")
