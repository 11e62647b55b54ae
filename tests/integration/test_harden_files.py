"""What imds leaves on disk is private: the database, its WAL and SHM, the keys and exports.

A real ``imds serve`` on a data directory it creates (the default SQLite database), then
``imds export`` to a file and to a folder: every file is 0600 and every directory imds made
0700, whatever the umask lets through (the test runs under a permissive one).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_process import run_imds, serving

INSTANCE = "5d2f0c1e-1b1d-4d8e-9f00-0000000000c3"


def mode(path: Path) -> int:
    """The permission bits of ``path``."""
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    """Umask 022 (what most shells have): a file created without an explicit mode would be 0644."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.usefixtures("permissive_umask")
def test_serve_creates_a_private_data_directory_database_and_keys(tmp_path: Path) -> None:
    """The data dir is 0700; imds.db, its -wal and -shm, and the generated keys are 0600 while serve runs."""
    data = tmp_path / "state" / "imds"
    with serving(tmp_path, "--data-dir", str(data)) as server:
        server.post("/device-metadata", {"id": INSTANCE, "ipAddresses": ["10.84.0.1"],
                                         "metadata": {"id": INSTANCE, "hostname": "files"}})
        files = sorted(path for path in data.iterdir() if path.is_file())
        names = {path.name for path in files}
        assert {"imds.db", "imds.db-wal", "imds.db-shm"} <= names, names
        assert any(name.endswith((".key", ".pem")) for name in names), names  # the token/identity keys
        assert mode(data) == 0o700
        assert {path.name: oct(mode(path)) for path in files} == {path.name: oct(0o600) for path in files}


@pytest.mark.usefixtures("permissive_umask")
def test_export_writes_private_files(tmp_path: Path) -> None:
    """``imds export FILE`` and ``--format dir FOLDER``: 0600 files, a 0700 folder; the content is the instance."""
    data = tmp_path / "data"
    with serving(tmp_path, "--data-dir", str(data)) as server:
        server.post("/device-metadata", {"id": INSTANCE, "ipAddresses": ["10.84.0.2"],
                                         "metadata": {"id": INSTANCE, "hostname": "exported"}})
    out = tmp_path / "export.jsonl"
    done = run_imds(tmp_path, "export", str(out), "--data-dir", str(data))
    assert done.returncode == 0, done.stderr
    assert INSTANCE in out.read_text()
    assert mode(out) == 0o600
    folder = tmp_path / "exported"
    done = run_imds(tmp_path, "export", str(folder), "--format", "dir", "--data-dir", str(data))
    assert done.returncode == 0, done.stderr
    assert mode(folder) == 0o700
    written = list(folder.iterdir())
    assert [path.name for path in written] == [f"{INSTANCE}.json"]
    assert mode(written[0]) == 0o600
