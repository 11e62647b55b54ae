"""The one parse of ``--db``: every PostgreSQL URL form operators write, and one clear line for a bad one."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from imds.cli import cli
from imds.config import load
from imds.config.database import DEFAULT_SOCKET_DIR, DatabaseUrlError, Server, parse_database, parse_source, redact
from imds.config.option import redact_url
from imds.errors import ConfigError
from imds.store.sql.diagnose import describe
from imds.store.sql.engine import connector_for


@pytest.mark.parametrize(("url", "servers"), [
    # libpq's host list in the URL (SQLAlchemy's parser refused it: a ValueError traceback)
    ("postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write", [("h1", 5432), ("h2", 5433)]),
    ("postgresql://u@h1,h2:6000/db", [("h1", 5432), ("h2", 6000)]),
    ("postgresql://u@[::1]:5433,[fd00::2]/db", [("::1", 5433), ("fd00::2", 5432)]),
    # ?host=h1,h2&port=p1,p2 (one port for all, or one per host)
    ("postgresql://u@/db?host=h1,h2&port=5432,5433", [("h1", 5432), ("h2", 5433)]),
    ("postgresql://u@/db?host=h1,h2&port=6000", [("h1", 6000), ("h2", 6000)]),
    # repeated host= (asyncpg and libpq keep only the last one): all of them, in order
    ("postgresql://u@/db?host=h1:5432&host=h2:5433", [("h1", 5432), ("h2", 5433)]),
    ("postgresql://u@/db?host=h1&host=h2&port=5432,5433", [("h1", 5432), ("h2", 5433)]),
    # the query's hosts replace the URL's, as in libpq
    ("postgresql://u@ignored:1/db?host=h2", [("h2", 5432)]),
    # Unix sockets: a directory, in the query or percent-encoded in the URL; none at all: Debian's
    ("postgresql://u@/db?host=/run/pg&port=5433", [("/run/pg", 5433)]),
    ("postgresql://u@%2Frun%2Fpg:5433/db", [("/run/pg", 5433)]),
    ("postgresql:///db", [(DEFAULT_SOCKET_DIR, 5432)]),
    ("postgresql://u@:5433/db", [(DEFAULT_SOCKET_DIR, 5433)]),  # a port and no host: the socket, as in libpq
    ("postgres://u:p@h/db", [("h", 5432)]),
])
def test_every_host_form_gives_the_servers_in_order(url: str, servers: list[tuple[str, int]]):
    """Each form operators write lists every server, in the order given, with its port."""
    assert [(s.host, s.port) for s in parse_database(url).servers] == servers


def test_credentials_database_and_tls_options():
    """User, password and database come from the URL (the query's override them); TLS options are kept."""
    database = parse_database("postgresql://imds:s%40cret@h/imds?sslmode=verify-full&sslrootcert=/etc/ca%20x.pem"
                              "&sslcert=/c.pem&sslkey=/k.pem&dbname=other")
    assert (database.user, database.password, database.name) == ("imds", "s@cret", "other")
    assert dict(database.tls) == {"sslmode": "verify-full", "sslrootcert": "/etc/ca x.pem", "sslcert": "/c.pem",
                                  "sslkey": "/k.pem"}
    assert database.params_dsn() == ("postgresql://?sslmode=verify-full&sslrootcert=/etc/ca%20x.pem&sslcert=/c.pem"
                                  "&sslkey=/k.pem")
    assert parse_database("postgresql://h/db").params_dsn() is None


@pytest.mark.parametrize("value", ["read-write", "primary"])
def test_read_write_session_attrs_are_accepted(value: str):
    """target_session_attrs=read-write (or primary) says what imds does anyway."""
    assert parse_database(f"postgresql://h1,h2/db?target_session_attrs={value}").servers


@pytest.mark.parametrize(("url", "says"), [
    ("postgresql://u@h1:5432,h2:x/db", "port 'x' is not a number"),
    ("postgresql://u@h1:70000/db", "port '70000' is not a number from 1 to 65535"),
    ("postgresql://u@h1,h2,h3/db?port=1,2", "3 hosts but 2 ports"),
    ("postgresql://u@h1,,h2/db", "an empty host"),
    ("postgresql://u@::1/db", "IPv6 address in brackets"),
    ("postgresql://u@[::1/db", "[ADDRESS]"),
    ("postgresql://h/db?target_session_attrs=read-only", "connects only to a read-write server"),
    ("postgresql://h/db?target_session_attrs=standby", "use read-write"),
    ("postgresql://h/db?target_session_attrs=fast", "is not one of any, read-write"),
    ("postgresql://h/db?sslmode=strict", "sslmode='strict' is not one of disable"),
    ("postgresql://h/db?sslrootcert=", "sslrootcert is empty"),
    ("postgresql://h/db?connect_timeout=0", "connect_timeout='0' is not a number of seconds above 0"),
    ("postgresql://h/db?connect_timeout=soon", "never waits without a bound"),
    ("postgresql://h/db?application_name=x", "imds names its sessions"),
    ("postgresql://h/db?keepalives_idle=5", "imds sets keepalives and TCP_USER_TIMEOUT"),
    ("postgresql://h/db?tcp_user_timeout=9000", "from --db-connect-timeout and --db-statement-timeout"),
    ("postgresql://h/db?colour=blue", "unknown parameter 'colour'"),
    ("postgresql://h/db?sslmode", "has no value"),
    ("postgresql://h/a/b", "has a '/'"),
    ("mysql://u:pw@h/db", "unsupported database URL scheme"),
])
def test_a_bad_url_is_one_line_naming_the_problem(url: str, says: str):
    """A malformed URL raises DatabaseUrlError (a ConfigError) whose one line names the problem and the URL."""
    with pytest.raises(DatabaseUrlError) as raised:
        parse_database(url)
    assert says in raised.value.message
    assert "\n" not in raised.value.message


def test_connect_timeout_in_the_url_is_seconds_per_server():
    """The URL's connect_timeout (libpq's: seconds per server) is read; it replaces --db-connect-timeout."""
    assert parse_database("postgresql://h1,h2/db?connect_timeout=3").connect_timeout == 3.0
    assert parse_database("postgresql://h1,h2/db").connect_timeout is None
    assert connector_for("postgresql://h1,h2/db?connect_timeout=3", connect_timeout=9).connect_timeout == 3.0
    assert connector_for("postgresql://h1,h2/db", connect_timeout=9).connect_timeout == 9.0


def test_a_source_keeps_what_a_read_only_database_url_may_say():
    """parse_source (imds import --from-hollow) keeps any target_session_attrs and passes other parameters on."""
    source = parse_source("postgres://u@/db?host=h1:26257&host=h2:26257&target_session_attrs=any"
                          "&application_name=copy&options=--cluster%3Dprod&sslmode=require&connect_timeout=4")
    assert [(s.host, s.port) for s in source.servers] == [("h1", 26257), ("h2", 26257)]
    assert (source.session_attrs, source.connect_timeout) == ("any", 4.0)
    assert source.params_dsn() == "postgresql://?sslmode=require&application_name=copy&options=--cluster%3Dprod"
    for bad, says in (("postgresql://u@h1:5432,h2:x/db", "port 'x'"), ("sqlite:///x.db", "PostgreSQL/CockroachDB"),
                      ("postgresql://u@[::1/db", "[ADDRESS]"), ("postgresql://h/db?target_session_attrs=fast",
                                                                "is not one of")):
        with pytest.raises(DatabaseUrlError, match=re.escape(says)):
            parse_source(bad)


def test_the_password_never_shows():
    """Messages and the shown URL hide the password, in the user part and in ?password=."""
    with pytest.raises(DatabaseUrlError) as raised:
        parse_database("postgresql://u:hunter2@h1:bad/db?password=hunter3")
    assert "hunter" not in raised.value.message
    assert redact("postgresql://u:pw@h1,h2/db?password=pw2&sslmode=require") == (
        "postgresql://u:***@h1,h2/db?password=***&sslmode=require")
    assert redact_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert parse_database("postgresql://u:pw@h/db").shown == "postgresql://u:***@h/db"


def test_servers_are_named_as_operators_wrote_them():
    """``where`` names every server of the URL: host and port, [v6]:port, or the socket file."""
    assert parse_database("postgresql://h1,h2:5433/db").where == "postgresql servers h1:5432, h2:5433"
    assert parse_database("postgresql:///db?host=/run/pg").where == "postgresql server /run/pg/.s.PGSQL.5432"
    assert str(Server("::1", 5)) == "[::1]:5"


@pytest.mark.parametrize(("url", "named"), [
    ("postgresql://imds@/imds?host=/var/run/postgresql&port=5433", "/var/run/postgresql/.s.PGSQL.5433"),
    ("postgresql://imds@db1.example:6432,db2.example:6432/imds", "db1.example:6432, db2.example:6432"),
    ("postgresql://imds@10.0.0.7/imds", "10.0.0.7:5432"),
])
def test_database_errors_name_the_real_servers(url: str, named: str):
    """A failure names the servers of the URL (never a localhost:5432 nobody configured)."""
    text = describe(url, ConnectionRefusedError(111, "Connection refused"))
    assert named in text
    assert "localhost" not in text
    assert "(database imds, user imds)" in text


def test_config_refuses_a_bad_url_naming_the_option():
    """load() refuses a malformed --db with the option's names, once, at start."""
    with pytest.raises(ConfigError, match=r"^--db / IMDS_DB: port 'x' is not a number from 1 to 65535 in"):
        load(environ={"IMDS_DB": "postgresql://u@h1:5432,h2:x/db"})
    assert load(environ={"IMDS_DB": "postgresql://u@h1:5432,h2:5433/db"}).store.db.endswith("h2:5433/db")


@pytest.mark.parametrize("command", [["serve"], ["db", "upgrade"], ["db", "current"], ["config", "show"]])
def test_commands_exit_2_with_one_line_for_a_bad_url(command: list[str], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch):
    """serve, db upgrade, db current and config show: exit 2, one error line, no traceback."""
    for name in list(os.environ):
        if name.startswith(("IMDS_", "METADATASERVICE_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    result = CliRunner().invoke(cli, [*command, "--db", "postgresql://u:pw@h1:5432,h2:x/db"])
    assert result.exit_code == 2, result.output
    assert "port 'x' is not a number" in result.output
    assert "Traceback" not in result.output
    assert "pw@" not in result.output
