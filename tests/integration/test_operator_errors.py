"""What an operator reads when storage or setup is wrong: one line naming the database, the cause and the fix.

Every command runs as the real ``imds`` executable (clean environment, bounded); the
server started here is stopped by its PID.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from imds.config import load
from serve_process import IMDS, Server, clean_env, free_port, run_imds, serving

DEMO_ID = "cc40301c-4038-4011-af55-6eae3ba60246"


def one_error_line(ran: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit 1, a single ``Error: …`` line on stderr holding every fragment, no traceback."""
    assert ran.returncode == 1, (ran.stdout, ran.stderr)
    lines = ran.stderr.splitlines()
    assert len(lines) == 1, ran.stderr
    assert lines[0].startswith("Error: "), ran.stderr
    for fragment in fragments:
        assert fragment in lines[0], ran.stderr
    return lines[0]


def test_a_file_where_the_data_dir_should_be_is_named(tmp_path):
    """--data-dir pointing at a file: the message names the file and the flag to check."""
    blocker = tmp_path / "data"
    blocker.write_text("not a directory")
    ran = run_imds(tmp_path, "db", "upgrade", "--data-dir", str(blocker))
    one_error_line(ran, "migration failed", f"{blocker}/imds.db", f"{blocker} is a file, not a directory", "--data-dir")
    built = run_imds(tmp_path, "configdrive", "build", "--data-dir", str(blocker), "--instance", DEMO_ID, "-o", "x.iso")
    one_error_line(built, f"{blocker} is a file, not a directory")


def test_a_directory_given_as_the_sqlite_file_is_named(tmp_path):
    """sqlite:///DIR: "unable to open database file" becomes which path and why."""
    ran = run_imds(tmp_path, "db", "upgrade", "--db", f"sqlite:///{tmp_path}")
    one_error_line(ran, "migration failed", f"SQLite database {tmp_path}", "is a directory, not a database file")


def test_postgres_connection_refused_names_server_database_and_user_not_the_password(tmp_path):
    """A closed port: host:port, database and user, "connection refused" and what to check; never the password."""
    port = free_port()
    url = f"postgresql://imds:hunter2@127.0.0.1:{port}/fleet"
    for args in (["db", "upgrade"], ["configdrive", "build", "--instance", DEMO_ID, "-o", "x.iso"]):
        ran = run_imds(tmp_path, *args, "--db", url)
        line = one_error_line(ran, f"127.0.0.1:{port}", "database fleet", "user imds", "connection refused")
        assert "hunter2" not in line


def test_postgres_scheme_is_accepted_as_an_alias(tmp_path):
    """postgres:// (libpq's and Heroku's spelling) is postgresql://: it gets as far as connecting."""
    assert load({"db": "postgres://u:p@db.example/imds"}, {"HOME": str(tmp_path)}).store.db == (
        "postgresql://u:p@db.example/imds"
    )
    port = free_port()
    ran = run_imds(tmp_path, "db", "upgrade", "--db", f"postgres://imds:pw@127.0.0.1:{port}/fleet")
    one_error_line(ran, "migration failed", f"127.0.0.1:{port}", "connection refused")


def test_an_unsupported_scheme_says_which_are(tmp_path):
    """Any other scheme is a usage error listing the accepted forms."""
    ran = run_imds(tmp_path, "db", "upgrade", "--db", "mysql://u:pw@h/db")
    assert ran.returncode == 2
    assert "use sqlite:///PATH, postgresql://USER:PASS@HOST:PORT/DB or memory://" in ran.stderr
    assert "pw@" not in ran.stderr


def test_configdrive_on_an_unmigrated_database_says_to_upgrade(tmp_path):
    """An empty SQLite file: "not migrated" with the command that fixes it, not "OperationalError"."""
    empty = tmp_path / "empty.db"
    empty.touch()  # an empty file is an empty SQLite database
    ran = run_imds(tmp_path, "configdrive", "build", "--db", f"sqlite:///{empty}", "--instance", DEMO_ID, "-o", "x.iso")
    line = one_error_line(ran, "database read failed", str(empty), "is not migrated", "imds db upgrade")
    assert "OperationalError" not in line


READERS = (("list",), ("get", DEMO_ID), ("explain", "127.0.0.1"), ("export", "-"), ("db", "current"),
           ("configdrive", "build", "--instance", DEMO_ID, "-o", "x.iso"))


@pytest.mark.parametrize("where", ["missing-dir", "existing-dir"])
def test_a_read_on_a_missing_sqlite_file_names_it_and_creates_nothing(tmp_path, where):
    """A typo'd path: every read-only command says which file is missing and the fix; no file or directory appears."""
    folder = tmp_path / ("typo" if where == "missing-dir" else "data")
    if where == "existing-dir":
        folder.mkdir()
    path = folder / "imds.db"
    for args in READERS:
        ran = run_imds(tmp_path, *args, "--db", f"sqlite:///{path}")
        one_error_line(ran, f"SQLite database {path}: no such file", "--db", "imds db upgrade")
    assert folder.exists() == (where == "existing-dir")
    assert not path.exists()


def test_a_missing_directory_in_db_is_refused_by_serve_and_import_but_made_by_db_upgrade(tmp_path):
    """``serve`` (which migrates) and ``import`` name the missing directory; ``imds db upgrade`` makes it on purpose."""
    path = tmp_path / "typo" / "imds.db"
    url = f"sqlite:///{path}"
    served = run_imds(tmp_path, "serve", "--db", url, "--listen", f"127.0.0.1:{free_port()}")
    one_error_line(served, f"SQLite database {path}: directory {path.parent} does not exist", "--db")
    records = tmp_path / "fleet.jsonl"
    records.write_text(json.dumps({"id": DEMO_ID, "ipAddresses": ["10.9.8.7"], "metadata": {"a": 1}}) + "\n")
    imported = run_imds(tmp_path, "import", str(records), "--db", url)
    assert imported.returncode == 1, imported.stderr
    assert f"directory {path.parent} does not exist" in imported.stderr.splitlines()[-1], imported.stderr
    assert not path.parent.exists()
    upgraded = run_imds(tmp_path, "db", "upgrade", "--db", url)
    assert (upgraded.returncode, upgraded.stdout) == (0, "database upgraded to head\n"), upgraded.stderr
    assert path.is_file()


def test_serve_creates_a_new_file_in_an_existing_directory(tmp_path):
    """A new database in an existing directory is a first start, not a typo: serve creates and migrates it.

    (A missing data directory is made too: ``test_serve_socket``'s server starts on one.)
    """
    existing = tmp_path / "existing"
    existing.mkdir()
    with serving(tmp_path, "--db", f"sqlite:///{existing / 'fresh.db'}", loaded=False) as server:
        assert server.process.poll() is None
    assert (existing / "fresh.db").is_file()


@pytest.mark.parametrize("url", ["sqlite:/var/lib/imds/imds.db", "sqlite:imds.db", "sqlite://imds.db", "sqlite://"])
def test_a_malformed_sqlite_url_is_one_usage_line(tmp_path, url):
    """SQLAlchemy's "Could not parse" (or a traceback) becomes the form to write, as a usage error."""
    for args in (("list",), ("db", "upgrade"), ("serve",)):
        ran = run_imds(tmp_path, *args, "--db", url)
        assert ran.returncode == 2, ran.stderr
        assert f"Error: --db / IMDS_DB: {url!r} is not an SQLite URL" in ran.stderr
        assert "sqlite:////absolute/path.db" in ran.stderr
        assert "Traceback" not in ran.stderr
        assert "SQLAlchemy" not in ran.stderr


@pytest.mark.parametrize("configured", [False, True])
def test_serve_warns_at_start_up_when_no_admin_auth_is_configured(tmp_path, configured):
    """Without a token, tokens file or OIDC issuer, the log says so (with the settings to use) before any call."""
    port = free_port()
    log = tmp_path / "serve.log"
    env = clean_env(tmp_path, **({"IMDS_ADMIN_TOKEN": "t"} if configured else {}))
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [str(IMDS), "serve", "--db", "memory://", "--listen", f"127.0.0.1:{port}"],
            env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
        )
    server = Server(process, f"http://127.0.0.1:{port}", log)
    try:
        server.wait_healthy()
        output = server.output()
    finally:
        server.stop()
    warned = [line for line in output.splitlines() if "admin.auth_not_configured" in line]
    if configured:
        assert warned == []
    else:
        assert len(warned) == 1, output
        assert '"level": "warning"' in warned[0] or "warning" in warned[0]
        assert "IMDS_ADMIN_TOKEN" in warned[0]
