"""The audit log: one row per admin write or delete.

Revision ID: 0005
Revises: 0003
Create Date: 2026-11-23

Compatibility: adds one table and changes none; a replica on an older revision writes no
audit rows but reads and writes everything else as before. Rows hold no document,
userdata, password or parameter value. Downgrading drops the log.
"""

from __future__ import annotations

import sqlalchemy as sa

from imds.store.sql.migrations.shapes import create_instance_log, drop_instance_log

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_instance_log(
        "audit_log",
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("instance_id", sa.String(36), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("applied", sa.Boolean(), nullable=False),
        sa.Column("detail", sa.JSON(none_as_null=True), nullable=False),
    )


def downgrade() -> None:
    drop_instance_log("audit_log")
