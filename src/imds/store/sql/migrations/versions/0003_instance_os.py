"""Ganeti OS records: os type, install mode, public and private OS parameters.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23

Compatibility: adds one table and changes none. A replica still running revision 0002
never reads it (it serves no ``/ganeti``), and deleting an instance there still removes
its OS record through the foreign key's ON DELETE CASCADE. Secret parameters are never
stored, in this table or anywhere. Downgrading drops stored OS records.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "instance_os",
        sa.Column("instance_id", sa.String(36), nullable=False),
        sa.Column("document", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["instance_id"], ["instances.id"], name=op.f("fk_instance_os_instance_id_instances"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("instance_id", name=op.f("pk_instance_os")),
    )


def downgrade() -> None:
    op.drop_table("instance_os")
