"""Instances read straight from a hollow-metadataservice database (``imds import --from-hollow DSN``).

hollow (github.com/metal-toolbox/hollow-metadataservice) keeps, by its goose migrations
(``db/migrations/00001`` to ``00005``), on PostgreSQL or CockroachDB:

- ``instance_metadata (id UUID PRIMARY KEY, metadata JSON, created_at, updated_at)``
- ``instance_userdata (id UUID PRIMARY KEY, userdata BYTES NULL, created_at, updated_at)``
- ``instance_ip_addresses (id UUID, instance_id UUID, address INET UNIQUE, …)``

An instance is an id in either of the first two tables; its addresses are the rows of the
third that name it (addresses of an id with neither record are not an instance, and are
left behind). Instances are read in pages ordered by id (keyset pagination: each page
starts after the last id of the one before, so every page is an index range scan), all in
one read-only REPEATABLE READ transaction: one consistent snapshot however long it takes.

Each instance becomes one upsert object in the import wire format
(``imds.services.transfer.readout``), so it goes through exactly the admin API's rules:

- ``metadata`` is the stored JSON text, which the metadata rules parse and check;
- a row whose userdata is over ``--max-body-bytes`` (or whose metadata text is over the row
  cap, ``imds.services.records.limits.max_item_bytes``) is refused by its size, measured by
  the database: the value itself is never read (``Oversized``), so memory is bounded by the
  caps, not by the data;
- ``userdata`` is base64 with ``"userdata_encoding": "base64"``, so any bytes survive exactly
  (NULL userdata is empty, as hollow serves it);
- ``ipAddresses`` are written as hollow shows them: the host, with ``/prefix`` when the
  prefix is shorter than the address (interface notation such as ``10.70.17.9/31`` is kept
  as stored, never rewritten to its network).

::

    async with HollowSource("postgresql://hollow@db:5432/hollow") as source:
        total = await source.count()
        async for page in source.pages(1000, Limits()):
            ...  # [{"id": ..., "ipAddresses": [...], "metadata": "...", "userdata": "..."}, ...]
"""

from __future__ import annotations

import base64
import importlib
from collections.abc import AsyncIterator
from typing import Any, Self

from imds.config.database import Database, parse_source
from imds.errors import Problem, StoreUnavailable
from imds.services.records.limits import Limits, check_size, flag_of, max_item_bytes
from imds.services.transfer.source import Oversized

_FIRST_IDS = """
SELECT id FROM (
    (SELECT id FROM instance_metadata ORDER BY id LIMIT $1)
    UNION
    (SELECT id FROM instance_userdata ORDER BY id LIMIT $1)
) AS ids ORDER BY id LIMIT $1
"""
_NEXT_IDS = """
SELECT id FROM (
    (SELECT id FROM instance_metadata WHERE id > $2::uuid ORDER BY id LIMIT $1)
    UNION
    (SELECT id FROM instance_userdata WHERE id > $2::uuid ORDER BY id LIMIT $1)
) AS ids ORDER BY id LIMIT $1
"""
# A value over its cap is measured, never sent: a row costs at most the caps in memory, whatever it holds.
_PAGE = """
SELECT page.id::text AS id, u.id IS NOT NULL AS has_userdata,
       octet_length(m.metadata::text) AS metadata_bytes, octet_length(u.userdata) AS userdata_bytes,
       CASE WHEN octet_length(m.metadata::text) <= {metadata_cap} THEN m.metadata::text END AS metadata,
       CASE WHEN octet_length(u.userdata) <= {userdata_cap} THEN u.userdata END AS userdata
FROM ({ids}) AS page
LEFT JOIN instance_metadata AS m ON m.id = page.id
LEFT JOIN instance_userdata AS u ON u.id = page.id
ORDER BY page.id
"""
_ADDRESSES = """
SELECT instance_id::text AS instance_id, host(address) AS host, masklen(address) AS prefix,
       family(address) AS family
FROM instance_ip_addresses
WHERE instance_id = ANY($1::text[]::uuid[])
ORDER BY instance_id, address
"""
_COUNT = "SELECT count(*) FROM (SELECT id FROM instance_metadata UNION SELECT id FROM instance_userdata) AS ids"
_FULL_PREFIX = {4: 32, 6: 128}
PRELOADED = ("asyncpg", "imds.store.sql.diagnose")  # what a reader may import (see preload)


def address_text(host: str, prefix: int, family: int) -> str:
    """The INET value as text: the host alone, or ``host/prefix`` when the prefix is shorter."""
    return host if prefix == _FULL_PREFIX.get(family) else f"{host}/{prefix}"


def wire_object(
    instance_id: str, metadata: str | None, userdata: bytes | None, addresses: list[str], *, has_userdata: bool,
) -> dict[str, Any]:
    """One hollow instance as an upsert object (see the module docstring)."""
    obj: dict[str, Any] = {"id": instance_id, "ipAddresses": addresses}
    if metadata is not None:
        obj["metadata"] = metadata
    if has_userdata:
        obj["userdata"], obj["userdata_encoding"] = base64.b64encode(userdata or b"").decode(), "base64"
    return obj


def connect_arguments(database: Database) -> dict[str, Any]:
    """The arguments of ``asyncpg.connect`` for a parsed DSN: every server of it, in order.

    asyncpg's own parse of a repeated ``host=`` keeps only the last; TLS and other parameters
    go as a host-less DSN, which asyncpg reads as libpq does.
    """
    arguments: dict[str, Any] = {
        "host": [server.host for server in database.servers], "port": [server.port for server in database.servers],
        "user": database.user, "password": database.password, "database": database.name,
        "dsn": database.params_dsn(),
    }
    if database.session_attrs is not None:
        arguments["target_session_attrs"] = database.session_attrs
    return arguments


def preload() -> None:
    """Import what reading may need (the driver, the database diagnostics) in the calling thread.

    A reader thread then imports nothing: two threads importing SQLAlchemy at once (the
    reader explaining a failure while the main thread migrates) can raise ImportError.
    """
    for module in PRELOADED:
        importlib.import_module(module)


class HollowSource:
    """A read-only snapshot of one hollow database; ``count`` and ``pages`` read from it."""

    def __init__(self, dsn: str, *, connect_timeout: float = 10.0) -> None:
        self._database = parse_source(dsn)  # DatabaseUrlError (a ConfigError), one line, for a malformed DSN
        self._timeout = self._database.connect_timeout or connect_timeout
        self._conn: Any = None
        self._tx: Any = None

    async def __aenter__(self) -> Self:
        """Connect and open the snapshot; StoreUnavailable naming the database when that fails."""
        import asyncpg  # type: ignore[import-untyped]  # noqa: PLC0415 - loads only for --from-hollow; no stubs

        try:
            self._conn = await asyncpg.connect(**connect_arguments(self._database), timeout=self._timeout)
            self._tx = self._conn.transaction(isolation="repeatable_read", readonly=True)
            await self._tx.start()
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            await self.__aexit__()
            raise StoreUnavailable(_describe(self._database, exc)) from exc
        return self

    async def __aexit__(self, *_exc: object) -> None:
        """End the snapshot (nothing was written) and close the connection."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                if self._tx is not None:
                    await self._tx.rollback()
            finally:
                await conn.close()

    async def count(self) -> int:
        """How many instances the snapshot holds."""
        value = await self._query("fetchval", _COUNT)
        return int(value)

    async def pages(self, size: int, limits: Limits) -> AsyncIterator[list[dict[str, Any] | Oversized]]:
        """Every instance as an upsert object (or its refusal by size), ``size`` at a time, by id."""
        after: str | None = None
        caps = (max_item_bytes(limits), limits.max_body_bytes)
        while True:
            if after is None:
                query = _PAGE.format(ids=_FIRST_IDS, metadata_cap="$2", userdata_cap="$3")
                rows = await self._query("fetch", query, size, *caps)
            else:
                query = _PAGE.format(ids=_NEXT_IDS, metadata_cap="$3", userdata_cap="$4")
                rows = await self._query("fetch", query, size, after, *caps)
            if not rows:
                return
            ids = [row["id"] for row in rows]
            addresses: dict[str, list[str]] = {}
            for found in await self._query("fetch", _ADDRESSES, ids):
                text = address_text(found["host"], found["prefix"], found["family"])
                addresses.setdefault(found["instance_id"], []).append(text)
            yield [_oversized(row, limits) or wire_object(
                       row["id"], row["metadata"], row["userdata"], addresses.get(row["id"], []),
                       has_userdata=row["has_userdata"]) for row in rows]
            after = ids[-1]

    async def _query(self, method: str, sql: str, *args: object) -> Any:
        import asyncpg  # noqa: PLC0415 - loaded already by __aenter__

        try:
            return await getattr(self._conn, method)(sql, *args)
        except asyncpg.UndefinedTableError as exc:
            msg = (f"hollow database {self._database.shown} has no hollow tables ({exc}): is it "
                   "hollow-metadataservice's database?")
            raise StoreUnavailable(msg) from exc
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StoreUnavailable(_describe(self._database, exc)) from exc


def _oversized(row: Any, limits: Limits) -> Oversized | None:
    """The refusal of a row whose values were left unread for their size, or None."""
    problems = []
    if row["metadata_bytes"] is not None and row["metadata"] is None:
        cap = max_item_bytes(limits)
        problems.append(Problem("metadata", f"is {row['metadata_bytes']} bytes as stored; at most {cap} are read "
                                            f"(16 x {flag_of('max_body_bytes')})"))
    if row["userdata_bytes"] is not None and row["userdata"] is None:
        problems += [p for p in [check_size("userdata", row["userdata_bytes"], limits)] if p is not None]
    return Oversized(problems, row["id"]) if problems else None


def _describe(database: Database, exc: BaseException) -> str:
    from imds.store.sql.diagnose import describe_server  # noqa: PLC0415 - loads SQLAlchemy: on failure only

    return f"hollow database: {describe_server(database, exc)}"
