"""Lifecycle notices and their acknowledgements.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28

Compatibility: adds two tables and changes none; a replica on an older revision never reads
them, serves no notices, and skips the feed's ``notice:<id>`` entries (no instance has that
id). Downgrading drops every notice and acknowledgement.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "notices",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("target", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("window_end", sa.DateTime(timezone=True), nullable=True),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("target_state", sa.String(64), nullable=True),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notices")),
    )
    op.create_index("ix_notices_scope_target", "notices", ["scope", "target"])
    op.create_table(
        "notice_acks",
        sa.Column("notice_id", sa.String(36), nullable=False),
        sa.Column("instance_id", sa.String(36), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["notice_id"], ["notices.id"], name=op.f("fk_notice_acks_notice_id_notices"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("notice_id", "instance_id", name=op.f("pk_notice_acks")),
    )


def downgrade() -> None:
    op.drop_table("notice_acks")
    op.drop_index("ix_notices_scope_target", table_name="notices")
    op.drop_table("notices")
