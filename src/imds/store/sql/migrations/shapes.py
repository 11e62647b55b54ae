"""Table shapes the migrations repeat, written once (the same DDL the revisions always emitted).

Revisions import these helpers from the installed package; changing a helper changes what
every revision using it creates, so a helper is only ever added to, never edited.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

ID = sa.String(36)
TS = sa.DateTime(timezone=True)


def create_one_per_instance(name: str, column: str, kind: sa.types.TypeEngine[Any]) -> None:
    """A table of at most one row per instance: its ``column`` and when it was written."""
    op.create_table(
        name,
        sa.Column("instance_id", ID, nullable=False),
        sa.Column(column, kind, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["instance_id"], ["instances.id"], name=op.f(f"fk_{name}_instance_id_instances"), ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("instance_id", name=op.f(f"pk_{name}")),
    )


def create_instance_log(name: str, key: sa.Column[Any], *columns: sa.Column[Any]) -> None:
    """A table of many rows per instance, keyed by ``key`` and indexed by ``instance_id``."""
    op.create_table(
        name, key, *columns, sa.PrimaryKeyConstraint(key.name, name=op.f(f"pk_{name}")),
    )
    op.create_index(op.f(f"ix_{name}_instance_id"), name, ["instance_id"])


def drop_instance_log(name: str) -> None:
    """Undo ``create_instance_log``."""
    op.drop_index(op.f(f"ix_{name}_instance_id"), table_name=name)
    op.drop_table(name)
