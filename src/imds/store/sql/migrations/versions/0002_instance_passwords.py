"""Instance passwords: the OpenStack password an instance posts once.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23

Compatibility: adds one table and changes none. A replica still running revision 0001
keeps working against this schema: it never reads the new table (it serves no
``/openstack/.../password``), and deleting an instance there still removes its password
row through the foreign key's ON DELETE CASCADE. Downgrading drops stored passwords.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from imds.store.sql.migrations.shapes import create_one_per_instance

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_one_per_instance("instance_passwords", "password", sa.LargeBinary())


def downgrade() -> None:
    op.drop_table("instance_passwords")
