"""One-line explanations of database failures for operators: which database, and what to do.

SQLAlchemy's own text names neither the file nor the server and wraps the driver's
message in its class name; ``describe`` says which database (password hidden), what went
wrong in plain words and, where there is one, the fix.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from imds.config.database import Database, DatabaseUrlError, parse_database, redact

_UPGRADE_HINT = "run `imds db upgrade` with the same --db / --data-dir (imds serve migrates at start-up)"


def shown(url: str) -> str:
    """The URL with its password hidden."""
    return redact(url)


def reason(exc: BaseException) -> str:
    """The driver's own message, first line, without SQLAlchemy's ``(module.Class)`` prefix."""
    source = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    if isinstance(source, TimeoutError) and not str(source):
        text = "no answer in time (the server stopped answering, or a statement ran past --db-statement-timeout)"
    elif isinstance(source, OSError) and source.strerror:
        text = source.strerror
    else:
        text = next(iter(str(source).splitlines()), "") or type(source).__name__
    return text.strip()


def describe(url: str, exc: BaseException) -> str:
    """Which database failed and why, in one line (no password, no SQL)."""
    try:
        database = parse_database(url)
    except DatabaseUrlError:
        return f"{reason(exc)} (unparsable database URL)"
    if database.kind == "sqlite":
        return _sqlite(make_url(url), exc)
    return describe_server(database, exc)


def is_not_migrated(exc: BaseException) -> bool:
    """Whether the failure is a missing table, i.e. a database ``imds db upgrade`` never ran on."""
    text = f"{type(getattr(exc, 'orig', None) or exc).__name__} {reason(exc)}".lower()
    return "no such table" in text or ("relation" in text and "does not exist" in text) or "undefinedtable" in text


def not_migrated(url: str, exc: BaseException) -> str:
    """The message for a database whose tables are missing."""
    return f"the database {shown(url)} is not migrated ({reason(exc)}): {_UPGRADE_HINT}"


def sqlite_problem(url: str, *, create: bool = False, data_dir: Path | None = None) -> str | None:
    """For an SQLite URL whose path cannot work here, why (None: go ahead).

    Checked before connecting: the driver's own failure says only "unable to open database file",
    and opening creates the file (and imds its directory). So a reader (``create`` False: the
    store, ``imds db current|check``) needs the file to exist: a read never creates one. A
    migration (``create``) may create it; with ``data_dir`` (``imds serve``, ``imds import``) in
    an existing directory or the data directory only, so a typo in ``--db`` is refused instead of
    becoming a new, empty database; without (``imds db upgrade``) with its directories too.
    """
    try:
        if parse_database(url).kind != "sqlite":
            return None
        parsed = make_url(url)
    except (ArgumentError, DatabaseUrlError):
        return None
    database = parsed.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    path = Path(database)
    why = _path_problem(path)
    if why is None and not create and not path.exists():
        why = ("no such file (check --db / IMDS_DB and --data-dir / IMDS_DATA_DIR): "
               "`imds db upgrade` creates it, as `imds serve` does at start-up")
    elif why is None and data_dir is not None and not path.parent.is_dir() and path.parent != data_dir:
        why = (f"directory {path.parent} does not exist (check --db / IMDS_DB; "
               "`imds db upgrade` creates directories)")
    return None if why is None else f"SQLite database {path}: {why}"


def _path_problem(path: Path) -> str | None:
    blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        return f"{blocker} is a file, not a directory (check --data-dir / IMDS_DATA_DIR and --db / IMDS_DB)"
    if path.is_dir():
        return f"{path} is a directory, not a database file (check --db / IMDS_DB)"
    return None


def _sqlite(parsed: URL, exc: BaseException) -> str:
    database = parsed.database or ":memory:"
    path = Path(database)
    why = reason(exc)
    if (problem := _path_problem(path)) is not None:
        why = problem
    elif path.parent.is_dir() and not os.access(path.parent, os.W_OK | os.X_OK):
        why = f"{why}: directory {path.parent} is not writable by this user"
    elif not path.parent.exists() and isinstance(exc, OSError):
        why = f"cannot create directory {path.parent}: {why}"
    return f"SQLite database {database}: {why}"


def describe_server(database: Database, exc: BaseException) -> str:
    """``postgresql server(s) H:P[, ...] (database D, user U): why`` (every server of the URL, as given)."""
    who = f"database {database.name or '(default)'}, user {database.user or '(default)'}"
    why = reason(exc)
    refused = ("connection refused", "connect call failed")
    if isinstance(exc, ConnectionRefusedError) or (len(database.servers) == 1 and any(
            text in why.lower() for text in refused)):
        why = "connection refused: is the server running, and are host and port right?"
    elif isinstance(exc, OSError) and not isinstance(exc, DBAPIError | ConnectionError | TimeoutError):
        why = f"cannot connect: {why}"
    return f"{database.where} ({who}): {why}"
