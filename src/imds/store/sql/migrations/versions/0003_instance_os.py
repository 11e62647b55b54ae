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

from imds.store.sql.migrations.shapes import create_one_per_instance

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_one_per_instance("instance_os", "document", sa.JSON(none_as_null=True))


def downgrade() -> None:
    op.drop_table("instance_os")
