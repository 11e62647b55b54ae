"""GCE project attributes: one row per project.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27

Compatibility: adds one table and changes none; a replica on an older revision never reads
it, serves the project attributes of the instance documents only, and skips the feed's
``project:<id>`` entries (no instance has that id). Downgrading drops every project's attributes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "project_attributes",
        sa.Column("project_id", sa.String(36), nullable=False),
        sa.Column("attributes", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("project_id", name=op.f("pk_project_attributes")),
    )


def downgrade() -> None:
    op.drop_table("project_attributes")
