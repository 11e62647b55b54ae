"""The instance<->host channel: events an instance posts, messages queued for it.

Revision ID: 0004
Revises: 0002
Create Date: 2026-11-23

Compatibility: adds two tables and changes none, so a replica still at an older revision
keeps working (it never reads them). Downgrading drops stored events and queued messages.
"""

from __future__ import annotations

import sqlalchemy as sa

from imds.store.sql.migrations.shapes import create_instance_log, drop_instance_log

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_CURSOR = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    create_instance_log(
        "instance_events",
        sa.Column("cursor", _CURSOR, autoincrement=True, nullable=False),
        sa.Column("instance_id", sa.String(36), nullable=False),
        sa.Column("state", sa.String(64), nullable=False),
        sa.Column("code", sa.Integer(), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    create_instance_log(
        "instance_messages",
        sa.Column("id", _CURSOR, autoincrement=True, nullable=False),
        sa.Column("instance_id", sa.String(36), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    drop_instance_log("instance_messages")
    drop_instance_log("instance_events")
