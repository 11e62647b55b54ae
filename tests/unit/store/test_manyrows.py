"""Many rows as positional tuples (``imds.store.sql.manyrows``): the same rows as SQLAlchemy's own path stores."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from imds.store.sql import statements, tables
from imds.store.sql.manyrows import positional_rows

IDS = [f"00000000-0000-4000-8000-{n:012d}" for n in range(3)]
AT = datetime(2026, 11, 28, 16, 0, 0, 123456, tzinfo=UTC)


def _engine() -> sa.Engine:
    engine = sa.create_engine("sqlite://")
    tables.metadata_obj.create_all(engine)
    return engine


def _batches() -> list[tuple[Any, list[dict[str, Any]]]]:
    """Every statement the write path runs for many rows, with every kind of value (JSON, bytes, times, NULL)."""
    later = AT + timedelta(seconds=1)
    return [
        (statements.ensure_instances("sqlite"), [{"id": i} for i in IDS]),
        (statements.upsert_record("sqlite", "instance_metadata"),
         [{"instance_id": i, "document": {"n": n, "ü": [1.5, None, "x"]}, "updated_at": AT if n else later}
          for n, i in enumerate(IDS)]),
        (statements.upsert_record("sqlite", "instance_userdata"),
         [{"instance_id": i, "userdata": b"\x00\xff" * n, "updated_at": AT} for n, i in enumerate(IDS)]),
        (statements.ADD_ADDRESSES,
         [{"address": f"10.0.0.{n}/32", "network": None if n else "10.0.0.0/32", "instance_id": i}
          for n, i in enumerate(IDS)]),
        (statements.MOVE_ADDRESS, [{"key": "10.0.0.1/32", "holder": IDS[0]}, {"key": "10.0.0.2/32", "holder": IDS[0]}]),
        (statements.FEED_ROWS, [{"seq": n + 1, "instance_id": i} for n, i in enumerate(IDS)]),
        (statements.AUDIT_ROWS,
         [{"at": AT, "subject": "cli", "instance_id": i, "action": "write", "kind": "metadata", "applied": bool(n),
           "detail": {"addresses": n, "moved": {}, "dropped": []}} for n, i in enumerate(IDS)]),
    ]


def _contents(engine: sa.Engine) -> dict[str, list[Any]]:
    with engine.connect() as conn:
        return {name: [tuple(row) for row in conn.exec_driver_sql(f"SELECT * FROM {name} ORDER BY 1")]  # noqa: S608 - table names of the schema
                for name in ("instances", "instance_metadata", "instance_userdata", "instance_ip_addresses",
                             "changes", "audit_log")}


def test_the_stored_rows_are_those_of_sqlalchemys_own_executemany() -> None:
    """Each statement for many rows, both ways: the same rows (``created_at`` aside: the server's clock)."""
    theirs, ours = _engine(), _engine()
    with theirs.begin() as conn:
        for statement, rows in _batches():
            conn.execute(statement, rows)
    with ours.begin() as conn:
        for statement, rows in _batches():
            found = positional_rows(conn.dialect, statement, rows)
            assert found is not None, statement
            conn.exec_driver_sql(*found)
    expected, got = _contents(theirs), _contents(ours)
    for name in ("instances", "instance_ip_addresses"):  # created_at: the server's CURRENT_TIMESTAMP
        expected[name] = [row[:-1] for row in expected[name]]
        got[name] = [row[:-1] for row in got[name]]
    assert got == expected
    assert got["instance_metadata"][0][1] == '{"n": 0, "\\u00fc": [1.5, null, "x"]}'  # JSON as SQLAlchemy writes it
    assert len(got["audit_log"]) == len(IDS)


def test_rows_it_cannot_take_go_back_to_sqlalchemy() -> None:
    """A row missing a key, rows that are not dictionaries, an expanding list: None.

    The caller's ordinary path then names the problem.
    """
    dialect = _engine().dialect
    rows = [{"seq": 1, "instance_id": IDS[0]}, {"seq": 2}]
    assert positional_rows(dialect, statements.FEED_ROWS, rows) is None
    assert positional_rows(dialect, statements.FEED_ROWS, [(1, IDS[0])]) is None
    assert positional_rows(dialect, statements.FEED_ROWS, []) is None
    expanding = tables.changes.delete().where(tables.changes.c.seq.in_(sa.bindparam("seqs", expanding=True)))
    assert positional_rows(dialect, expanding, [{"seqs": [1]}, {"seqs": [2]}]) is None


def test_a_value_shared_by_rows_is_processed_once_and_a_constant_of_the_statement_is_kept() -> None:
    """The batch's time is formatted once for all its rows; ``WHERE id = 1`` keeps its 1 in every tuple."""
    dialect = _engine().dialect
    found = positional_rows(dialect, statements.upsert_record("sqlite", "instance_userdata"),
                            [{"instance_id": i, "userdata": b"x", "updated_at": AT} for i in IDS])
    assert found is not None
    sql, tuples = found
    assert sql.count("?") == 3
    assert [t[2] for t in tuples] == ["2026-11-28 16:00:00.123456"] * len(IDS)
    assert tuples[0][2] is tuples[1][2]
    head = tables.feed_head.update().where(tables.feed_head.c.id == 1).values(seq=sa.bindparam("head"))
    found = positional_rows(dialect, head, [{"head": 5}, {"head": 6}])
    assert found is not None
    assert found[1] == [(5, 1), (6, 1)]
