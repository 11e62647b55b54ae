"""The schema, as SQLAlchemy Core tables. Alembic migrations must match it (``imds db check``)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

metadata_obj = sa.MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

_ID = sa.String(36)
_NOW = sa.func.current_timestamp()

instances = sa.Table(
    "instances",
    metadata_obj,
    sa.Column("id", _ID, primary_key=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_NOW),
)


def _one_per_instance(name: str, column: str, kind: sa.types.TypeEngine[Any]) -> sa.Table:
    """A table of at most one row per instance: its value ``column`` and when it was written."""
    return sa.Table(
        name,
        metadata_obj,
        sa.Column("instance_id", _ID, sa.ForeignKey("instances.id", ondelete="CASCADE"), primary_key=True),
        sa.Column(column, kind, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


instance_metadata = _one_per_instance("instance_metadata", "document", sa.JSON(none_as_null=True))
instance_userdata = _one_per_instance("instance_userdata", "userdata", sa.LargeBinary())

# One row per address: the primary key is what makes an address belong to one instance, and
# ``network`` (``models.network_key``) what makes two spellings of one network one address
# (the writes keep one row per network; revision 0008).
instance_ip_addresses = sa.Table(
    "instance_ip_addresses",
    metadata_obj,
    sa.Column("address", sa.String(64), primary_key=True),
    sa.Column("network", sa.String(64), nullable=True, index=True),
    sa.Column(
        "instance_id", _ID, sa.ForeignKey("instances.id", ondelete="CASCADE"), nullable=False, index=True
    ),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_NOW),
)

# The change feed. No foreign key: deleted instances stay in the feed.
changes = sa.Table(
    "changes",
    metadata_obj,
    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("instance_id", _ID, nullable=False),
    sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False, server_default=_NOW),
)

# A single row (id = 1). Every write transaction locks it first: that serialises writers
# on every backend (SQLite has one writer anyway) and so makes feed sequence numbers
# commit in order, which is what lets followers read the feed with "seq > last".
feed_head = sa.Table(
    "feed_head",
    metadata_obj,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("seq", sa.BigInteger, nullable=False),
)

# The OpenStack password an instance posts once (revision 0002); an admin may clear it.
instance_passwords = _one_per_instance("instance_passwords", "password", sa.LargeBinary())

# The Ganeti OS record (revision 0003): os type, mode and the public and private parameters.
# Secret parameters and package credentials are never stored; ``document`` lists only
# their names. Private values are Fernet tokens when the service has a key file.
instance_os = _one_per_instance("instance_os", "document", sa.JSON(none_as_null=True))

# The instance<->host channel (revision 0004). No foreign keys: an event posted while an
# admin deletes the instance must not fail, and the host may read events of a gone instance.
_CURSOR = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite autoincrements INTEGER keys only

instance_events = sa.Table(
    "instance_events",
    metadata_obj,
    sa.Column("cursor", _CURSOR, primary_key=True, autoincrement=True),
    sa.Column("instance_id", _ID, nullable=False, index=True),
    sa.Column("state", sa.String(64), nullable=False),
    sa.Column("code", sa.Integer, nullable=True),
    sa.Column("message", sa.Text, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

instance_messages = sa.Table(
    "instance_messages",
    metadata_obj,
    sa.Column("id", _CURSOR, primary_key=True, autoincrement=True),
    sa.Column("instance_id", _ID, nullable=False, index=True),
    sa.Column("body", sa.LargeBinary, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

# The audit log (revision 0005): one row per admin write or delete, written in its transaction.
# ``detail`` holds facts only (moved and dropped addresses, counts, OS type): never a value.
audit_log = sa.Table(
    "audit_log",
    metadata_obj,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("subject", sa.String(255), nullable=False),
    sa.Column("instance_id", _ID, nullable=False, index=True),
    sa.Column("action", sa.String(16), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("applied", sa.Boolean, nullable=False),
    sa.Column("detail", sa.JSON(none_as_null=True), nullable=False),
)

# GCE project attributes (revision 0006): one row per project, written by PUT /projects/{id}/attributes.
# ``revision`` counts the project's writes (its instances' GCE ETag covers it). A change reaches the
# feed as the id ``project:<id>`` (instance ids are UUIDs), so replicas re-read the row.
project_attributes = sa.Table(
    "project_attributes",
    metadata_obj,
    sa.Column("project_id", _ID, primary_key=True),
    sa.Column("attributes", sa.JSON(none_as_null=True), nullable=False),
    sa.Column("revision", sa.BigInteger, nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)

# Lifecycle notices (revision 0007): one row per notice, the scope (instance, project or facility)
# and its target, written through /notices. A change reaches the feed as ``notice:<id>``, so
# replicas re-read the row. Guests' acknowledgements are rows of their own (the first one counts).
notices = sa.Table(
    "notices",
    metadata_obj,
    sa.Column("id", _ID, primary_key=True),
    sa.Column("scope", sa.String(16), nullable=False),
    sa.Column("target", sa.String(64), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("time", sa.DateTime(timezone=True), nullable=False),
    sa.Column("window_end", sa.DateTime(timezone=True), nullable=True),
    sa.Column("description", sa.Text, nullable=False),
    sa.Column("target_state", sa.String(64), nullable=True),
    sa.Column("revision", sa.BigInteger, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    sa.Index("ix_notices_scope_target", "scope", "target"),
)

notice_acks = sa.Table(
    "notice_acks",
    metadata_obj,
    sa.Column("notice_id", _ID, sa.ForeignKey("notices.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("instance_id", _ID, primary_key=True),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
)
