"""Which SQLite paths a command may open (``imds.store.sql.diagnose.sqlite_problem``), before anything is created."""

from __future__ import annotations

from pathlib import Path

from imds.store.sql.diagnose import sqlite_problem


def test_a_reader_needs_the_file(tmp_path: Path) -> None:
    """A read never creates a database: a missing file is named, with the command that creates it."""
    path = tmp_path / "imds.db"
    problem = sqlite_problem(f"sqlite:///{path}")
    assert problem is not None
    assert problem.startswith(f"SQLite database {path}: no such file")
    assert "imds db upgrade" in problem
    path.touch()
    assert sqlite_problem(f"sqlite:///{path}") is None


def test_a_migration_with_a_data_dir_creates_only_a_file_or_the_data_dir(tmp_path: Path) -> None:
    """serve/import: a new file in an existing directory or in the data directory; a missing other one is named."""
    data = tmp_path / "data"
    assert sqlite_problem(f"sqlite:///{tmp_path / 'new.db'}", create=True, data_dir=data) is None
    assert sqlite_problem(f"sqlite:///{data / 'imds.db'}", create=True, data_dir=data) is None
    typo = tmp_path / "typo" / "deeper" / "imds.db"
    problem = sqlite_problem(f"sqlite:///{typo}", create=True, data_dir=data)
    assert problem == (f"SQLite database {typo}: directory {typo.parent} does not exist "
                       "(check --db / IMDS_DB; `imds db upgrade` creates directories)")
    assert not typo.parent.exists()


def test_db_upgrade_may_create_directories_and_nothing_else_is_checked(tmp_path: Path) -> None:
    """Without a data directory (imds db upgrade) a missing directory is fine; other URLs are not SQLite paths."""
    assert sqlite_problem(f"sqlite:///{tmp_path / 'a' / 'b' / 'imds.db'}", create=True) is None
    for url in ("sqlite:///:memory:", "postgresql://u@h/db", "memory://", "sqlite:/unparsable"):
        assert sqlite_problem(url) is None, url


def test_a_file_in_the_way_is_named_whatever_the_command(tmp_path: Path) -> None:
    """A file where a directory must be (or a directory as the database) is refused before any creation."""
    blocker = tmp_path / "data"
    blocker.write_text("x")
    for create in (False, True):
        problem = sqlite_problem(f"sqlite:///{blocker / 'imds.db'}", create=create)
        assert problem is not None
        assert f"{blocker} is a file, not a directory" in problem
    assert "is a directory" in (sqlite_problem(f"sqlite:///{tmp_path}", create=True) or "")
