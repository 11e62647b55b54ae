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
_MOMENT = sa.DateTime(timezone=True)  # every point in time, stored with its zone
_JSON = sa.JSON(none_as_null=True)  # a document: Python's None is SQL NULL, not the JSON text null
_NOW = sa.func.current_timestamp()


def _table(name: str, *parts: Any) -> sa.Table:
    """A table of imds's schema (``metadata_obj``, its naming convention)."""
    return sa.Table(name, metadata_obj, *parts)


def _required(name: str, *kind: Any, **options: Any) -> sa.Column[Any]:
    """A column every row fills in (``NOT NULL``): most of them."""
    return sa.Column(name, *kind, nullable=False, **options)


instances = _table(
    "instances",
    sa.Column("id", _ID, primary_key=True),
    _required("created_at", _MOMENT, server_default=_NOW),
)


def _one_per_instance(name: str, column: str, kind: sa.types.TypeEngine[Any]) -> sa.Table:
    """A table of at most one row per instance: its value ``column`` and when it was written."""
    return _table(
        name,
        sa.Column("instance_id", _ID, sa.ForeignKey("instances.id", ondelete="CASCADE"), primary_key=True),
        _required(column, kind),
        _required("updated_at", _MOMENT),
    )


instance_metadata = _one_per_instance("instance_metadata", "document", _JSON)
instance_userdata = _one_per_instance("instance_userdata", "userdata", sa.LargeBinary())

# One row per address: the primary key is what makes an address belong to one instance, and
# ``network`` (``models.network_key``) what makes two spellings of one network one address
# (the writes keep one row per network; revision 0008).
instance_ip_addresses = _table(
    "instance_ip_addresses",
    sa.Column("address", sa.String(64), primary_key=True),
    sa.Column("network", sa.String(64), nullable=True, index=True),
    _required("instance_id", _ID, sa.ForeignKey("instances.id", ondelete="CASCADE"), index=True),
    _required("created_at", _MOMENT, server_default=_NOW),
)

# The change feed. No foreign key: deleted instances stay in the feed.
changes = _table(
    "changes",
    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
    _required("instance_id", _ID),
    _required("changed_at", _MOMENT, server_default=_NOW),
)

# A single row (id = 1). Every write transaction locks it first: that serialises writers
# on every backend (SQLite has one writer anyway) and so makes feed sequence numbers
# commit in order, which is what lets followers read the feed with "seq > last".
feed_head = _table(
    "feed_head",
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    _required("seq", sa.BigInteger),
)

# The OpenStack password an instance posts once (revision 0002); an admin may clear it.
instance_passwords = _one_per_instance("instance_passwords", "password", sa.LargeBinary())

# The Ganeti OS record (revision 0003): os type, mode and the public and private parameters.
# Secret parameters and package credentials are never stored; ``document`` lists only
# their names. Private values are Fernet tokens when the service has a key file.
instance_os = _one_per_instance("instance_os", "document", _JSON)

# The instance<->host channel (revision 0004). No foreign keys: an event posted while an
# admin deletes the instance must not fail, and the host may read events of a gone instance.
_CURSOR = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite autoincrements INTEGER keys only

instance_events = _table(
    "instance_events",
    sa.Column("cursor", _CURSOR, primary_key=True, autoincrement=True),
    _required("instance_id", _ID, index=True),
    _required("state", sa.String(64)),
    sa.Column("code", sa.Integer, nullable=True),
    sa.Column("message", sa.Text, nullable=True),
    _required("created_at", _MOMENT),
)

instance_messages = _table(
    "instance_messages",
    sa.Column("id", _CURSOR, primary_key=True, autoincrement=True),
    _required("instance_id", _ID, index=True),
    _required("body", sa.LargeBinary),
    _required("created_at", _MOMENT),
)

# The audit log (revision 0005): one row per admin write or delete, written in its transaction.
# ``detail`` holds facts only (moved and dropped addresses, counts, OS type): never a value.
audit_log = _table(
    "audit_log",
    sa.Column("seq", _CURSOR, primary_key=True, autoincrement=True),
    _required("at", _MOMENT),
    _required("subject", sa.String(255)),
    _required("instance_id", _ID, index=True),
    _required("action", sa.String(16)),
    _required("kind", sa.String(16)),
    _required("applied", sa.Boolean),
    _required("detail", _JSON),
)

# GCE project attributes (revision 0006): one row per project, written by PUT /projects/{id}/attributes.
# ``revision`` counts the project's writes (its instances' GCE ETag covers it). A change reaches the
# feed as the id ``project:<id>`` (instance ids are UUIDs), so replicas re-read the row.
project_attributes = _table(
    "project_attributes",
    sa.Column("project_id", _ID, primary_key=True),
    _required("attributes", _JSON),
    _required("revision", sa.BigInteger),
    _required("updated_at", _MOMENT),
)

# Lifecycle notices (revision 0007): one row per notice, the scope (instance, project or facility)
# and its target, written through /notices. A change reaches the feed as ``notice:<id>``, so
# replicas re-read the row. Guests' acknowledgements are rows of their own (the first one counts).
notices = _table(
    "notices",
    sa.Column("id", _ID, primary_key=True),
    _required("scope", sa.String(16)),
    _required("target", sa.String(64)),
    _required("kind", sa.String(16)),
    _required("state", sa.String(16)),
    _required("time", _MOMENT),
    sa.Column("window_end", _MOMENT, nullable=True),
    _required("description", sa.Text),
    sa.Column("target_state", sa.String(64), nullable=True),
    _required("revision", sa.BigInteger),
    _required("created_at", _MOMENT),
    _required("updated_at", _MOMENT),
    sa.Index("ix_notices_scope_target", "scope", "target"),
)

notice_acks = _table(
    "notice_acks",
    sa.Column("notice_id", _ID, sa.ForeignKey("notices.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("instance_id", _ID, primary_key=True),
    _required("at", _MOMENT),
)
