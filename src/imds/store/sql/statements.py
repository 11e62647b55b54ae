"""The write path's statements, built once.

Building a Core statement and computing its cache key costs more than running it:
``select(feed_head.c.seq).where(feed_head.c.id == 1)`` built per call took 46 µs against
11 µs prebuilt, an ``IN`` query 122 µs against 35 µs (SQLite, in memory). The statements
every write runs are therefore module constants with bound parameters (``expanding``
ones for ``IN`` lists), and the dialect-specific upserts are built once per dialect.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from imds.store.sql.listen import CHANNEL
from imds.store.sql.tables import (
    audit_log,
    changes,
    feed_head,
    instance_ip_addresses,
    instance_metadata,
    instance_userdata,
    instances,
)

_a, _m = instance_ip_addresses, instance_metadata

# The group commit (SQLite): lock and read the feed head, insert its rows, move the head.
FEED_HEAD_LOCKED = sa.select(feed_head.c.seq).where(feed_head.c.id == 1).with_for_update()
# PostgreSQL: the same, and no sequential scans for the rest of the write transaction
# (``SET LOCAL``, in the same round trip). Every statement of the write path looks rows up
# by key, but until autovacuum first analyses a table (a new database, its first
# minute or so) the planner has no statistics, and it planned the address lookup as a
# sequential scan: 8 million rows read for 8,000 upserts into a new database.
PG_FEED_HEAD_LOCKED = (
    sa.select(feed_head.c.seq, sa.func.set_config("enable_seqscan", "off", sa.true()))
    .where(feed_head.c.id == 1).with_for_update()
)
ANY_INSTANCE = sa.select(instances.c.id).limit(1)
FEED_ROWS = changes.insert()
AUDIT_ROWS = audit_log.insert()
MOVE_HEAD = feed_head.update().where(feed_head.c.id == 1).values(seq=sa.bindparam("head"))

# PostgreSQL: the whole end of a group commit in one round trip: its feed rows, its audit
# rows (arrays, one element per row: ``unnest`` turns them back into rows), the head moved
# (only if it moves) and NOTIFY. Three statements cost three round trips, and each wakes
# the database's backend: on a busy writer the ``send()`` into its socket was most of
# the group commit's own time.
GROUP_ROWS_AND_HEAD = sa.text("""
WITH feed AS (
    INSERT INTO changes (seq, instance_id)
    SELECT * FROM unnest(CAST(:feed_seqs AS BIGINT[]), CAST(:feed_ids AS VARCHAR[]))
), audit AS (
    INSERT INTO audit_log (at, subject, instance_id, action, kind, applied, detail)
    SELECT at, subject, instance_id, action, kind, applied, CAST(detail AS JSON)
    FROM unnest(CAST(:at AS TIMESTAMPTZ[]), CAST(:subject AS VARCHAR[]), CAST(:instance_id AS VARCHAR[]),
                CAST(:action AS VARCHAR[]), CAST(:kind AS VARCHAR[]), CAST(:applied AS BOOLEAN[]),
                CAST(:detail AS TEXT[])) AS rows (at, subject, instance_id, action, kind, applied, detail)
), moved AS (
    UPDATE feed_head SET seq = :head WHERE id = 1 AND seq <> :head RETURNING seq
)
SELECT pg_notify(:channel, CAST(seq AS TEXT)) FROM moved
""")
AUDIT_COLUMNS = ("at", "subject", "instance_id", "action", "kind", "applied")


def group_rows_and_head(
    feed_rows: list[dict[str, Any]], audit_rows: list[dict[str, Any]], head: int
) -> dict[str, Any]:
    """The parameters of ``GROUP_ROWS_AND_HEAD``: each column of the rows as one array."""
    parameters: dict[str, Any] = {
        "feed_seqs": [row["seq"] for row in feed_rows], "feed_ids": [row["instance_id"] for row in feed_rows],
        "detail": [json.dumps(row["detail"]) for row in audit_rows], "head": head, "channel": CHANNEL,
    }
    parameters.update({column: [row[column] for row in audit_rows] for column in AUDIT_COLUMNS})
    return parameters


# The batch forms (``ids``, ``addresses``: lists). PostgreSQL gets ``= ANY(array)``: one SQL text
# whatever the list's length, so one prepared statement per connection instead of one per
# length (an expanding ``IN`` renders ``$1, …, $n``; each new text cost a prepare round trip).
# SQLite gets ``IN (SELECT value FROM json_each(:list))``, the list as one JSON text: an
# expanding ``IN`` re-rendered the statement on every call (a fifth of an import's address
# step), and the plan is the same (an index search per value).
_VALUE = sa.column("value", sa.String)


def among(column: sa.Column[str], name: str, dialect: str) -> sa.ColumnElement[bool]:
    """``column`` is one of the list parameter ``name`` (see above)."""
    if dialect == "postgresql":
        return column == sa.any_(sa.bindparam(name, type_=postgresql.ARRAY(sa.String)))
    listed = sa.select(_VALUE).select_from(sa.func.json_each(sa.bindparam(name, type_=sa.JSON())))
    return column.in_(listed)


@functools.cache
def documents_of(dialect: str) -> sa.Select[tuple[str, Any]]:
    """The metadata documents of ``ids``."""
    return sa.select(_m.c.instance_id, _m.c.document).where(among(_m.c.instance_id, "ids", dialect))


@functools.cache
def addresses_touched(dialect: str) -> sa.Select[tuple[str, str | None, str]]:
    """(address, network, holder) of every address held by one of ``ids``, or naming one of ``networks``.

    A row written before revision 0008 by an older replica has no network: it is found by
    its address (``addresses``), and the caller reads its network from it.
    """
    return sa.select(_a.c.address, _a.c.network, _a.c.instance_id).where(
        among(_a.c.instance_id, "ids", dialect) | among(_a.c.network, "networks", dialect)
        | among(_a.c.address, "addresses", dialect)
    )


@functools.cache
def drop_addresses(dialect: str) -> sa.Delete:
    """Delete the rows of ``addresses``."""
    return _a.delete().where(among(_a.c.address, "addresses", dialect))


MOVE_ADDRESS = _a.update().where(_a.c.address == sa.bindparam("key")).values(instance_id=sa.bindparam("holder"))
ADD_ADDRESSES = _a.insert()

_RECORD_COLUMNS = {instance_metadata.name: "document", instance_userdata.name: "userdata"}


@functools.cache
def ensure_instances(dialect: str) -> sa.Insert:
    """``INSERT … ON CONFLICT DO NOTHING`` of instance rows (params: ``id``)."""
    statement: sa.Insert = _insert(dialect, instances).on_conflict_do_nothing()
    return statement


@functools.cache
def upsert_record(dialect: str, table_name: str) -> sa.Insert:
    """Insert or replace a record row (params: ``instance_id``, the record column, ``updated_at``)."""
    table = instance_metadata if table_name == instance_metadata.name else instance_userdata
    column = _RECORD_COLUMNS[table_name]
    statement = _insert(dialect, table)
    upsert: sa.Insert = statement.on_conflict_do_update(
        index_elements=[table.c.instance_id],
        set_={column: statement.excluded[column], "updated_at": statement.excluded.updated_at},
    )
    return upsert


# PostgreSQL: a batch's records upserted in one statement that also inserts the instance
# rows they need (``ensured``: the rows that exist are left alone), the values as arrays.
_PG_RECORDS = """
WITH ensured AS (
    INSERT INTO instances (id) SELECT unnest(CAST(:new_ids AS VARCHAR[])) ON CONFLICT DO NOTHING
)
INSERT INTO {table} (instance_id, {column}, updated_at)
SELECT instance_id, CAST(value AS {type}), CAST(:updated_at AS TIMESTAMPTZ)
FROM unnest(CAST(:ids AS VARCHAR[]), CAST(:values AS {type}[])) AS rows (instance_id, value)
ON CONFLICT (instance_id) DO UPDATE SET {column} = excluded.{column}, updated_at = excluded.updated_at
"""
PG_UPSERT_RECORDS = {
    instance_metadata.name: sa.text(_PG_RECORDS.format(table=instance_metadata.name, column="document", type="JSON")),
    instance_userdata.name: sa.text(_PG_RECORDS.format(table=instance_userdata.name, column="userdata", type="BYTEA")),
}


def pg_upsert_records(new_ids: list[str], values: dict[str, Any], at: Any) -> dict[str, Any]:
    """The parameters of ``PG_UPSERT_RECORDS``: documents as JSON text, userdata as bytes."""
    encoded = [json.dumps(v) if isinstance(v, dict) else v for v in values.values()]
    return {"new_ids": new_ids, "ids": list(values), "values": encoded, "updated_at": at}


def _insert(dialect: str, table: sa.Table) -> Any:  # either dialect's Insert (with its on_conflict_* methods)
    return pg_insert(table) if dialect == "postgresql" else sqlite_insert(table)
