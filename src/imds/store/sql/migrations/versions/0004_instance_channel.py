"""The instance<->host channel: events an instance posts, messages queued for it.

Revision ID: 0004
Revises: 0002
Create Date: 2026-11-23

Compatibility: adds two tables and changes none, so a replica still at an older revision
keeps working (it never reads them). Downgrading drops stored events and queued messages.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_CURSOR = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "instance_events",
        sa.Column("cursor", _CURSOR, autoincrement=True, nullable=False),
        sa.Column("instance_id", sa.String(36), nullable=False),
        sa.Column("state", sa.String(64), nullable=False),
        sa.Column("code", sa.Integer(), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("cursor", name=op.f("pk_instance_events")),
    )
    op.create_index(op.f("ix_instance_events_instance_id"), "instance_events", ["instance_id"])
    op.create_table(
        "instance_messages",
        sa.Column("id", _CURSOR, autoincrement=True, nullable=False),
        sa.Column("instance_id", sa.String(36), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instance_messages")),
    )
    op.create_index(op.f("ix_instance_messages_instance_id"), "instance_messages", ["instance_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_instance_messages_instance_id"), table_name="instance_messages")
    op.drop_table("instance_messages")
    op.drop_index(op.f("ix_instance_events_instance_id"), table_name="instance_events")
    op.drop_table("instance_events")
