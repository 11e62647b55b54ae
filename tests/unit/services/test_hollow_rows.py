"""hollow's rows as import objects: addresses as hollow shows them, userdata as exact bytes, the DSN checked."""

from __future__ import annotations

import base64

import pytest

from imds.config.database import parse_source
from imds.errors import ConfigError, InvalidInput
from imds.services.transfer.bulk import parse_item
from imds.services.transfer.hollow_source import HollowSource, address_text, connect_arguments, wire_object

ID = "7d0ab2bc-3a53-4d5e-8f44-2b2b9c1f6a10"


@pytest.mark.parametrize(("host", "prefix", "family", "text"), [
    ("10.70.17.9", 32, 4, "10.70.17.9"),
    ("10.70.17.9", 31, 4, "10.70.17.9/31"),
    ("10.20.0.0", 16, 4, "10.20.0.0/16"),
    ("2604:1380:4641:1f00::9", 128, 6, "2604:1380:4641:1f00::9"),
    ("2604:1380:4641:1f00::9", 127, 6, "2604:1380:4641:1f00::9/127"),
])
def test_an_address_keeps_its_prefix_only_when_shorter_than_a_host(host, prefix, family, text) -> None:
    """A full-length prefix is a host (no suffix); any other prefix is kept as stored, never widened."""
    assert address_text(host, prefix, family) == text


def test_binary_userdata_parses_back_to_the_same_bytes() -> None:
    """Bytes that are not UTF-8 go as base64 and come out of the import rules unchanged."""
    raw = bytes(range(256)) + b"\xff\xfe\x00"
    item = parse_item(wire_object(ID, '{"hostname": "a"}', raw, ["10.0.0.5"], has_userdata=True), label="instance 1")
    assert item.userdata is not None
    assert item.userdata.userdata == raw
    assert item.metadata is not None
    assert item.metadata.metadata == {"hostname": "a"}


def test_null_userdata_is_empty_and_a_missing_row_is_absent() -> None:
    """NULL userdata is empty userdata (hollow serves it so); no userdata row, no userdata part."""
    empty = wire_object(ID, None, None, [], has_userdata=True)
    assert base64.b64decode(empty["userdata"]) == b""
    assert parse_item(empty, label="instance 1").userdata is not None
    metadata_only = wire_object(ID, "{}", None, ["10.0.0.5"], has_userdata=False)
    assert "userdata" not in metadata_only
    assert parse_item(metadata_only, label="instance 2").userdata is None


def test_a_metadata_column_that_is_not_an_object_is_refused_by_the_rules() -> None:
    """The JSON column may hold any JSON; the import rules refuse what is not an object."""
    with pytest.raises(InvalidInput) as caught:
        parse_item(wire_object(ID, "[1, 2]", None, [], has_userdata=False), label="instance 1")
    assert [(p.field, p.message) for p in caught.value.problems] == [
        ("metadata", "must be a JSON object (or a JSON-encoded object string)")]


@pytest.mark.parametrize("dsn", ["postgresql://h@db/hollow", "postgres://h@db/hollow",
                                 "postgresql+asyncpg://h@db/hollow"])
def test_postgres_urls_are_taken(dsn: str) -> None:
    """Both PostgreSQL schemes, and SQLAlchemy's asyncpg form, name the same server, user and database."""
    arguments = connect_arguments(parse_source(dsn))
    assert (arguments["host"], arguments["port"], arguments["user"], arguments["database"]) == (
        ["db"], [5432], "h", "hollow")


def test_every_server_of_a_repeated_host_is_passed_on() -> None:
    """Every repeated host= goes to asyncpg, in order, as a list (its own parse keeps only the last)."""
    arguments = connect_arguments(parse_source("postgresql://h@/hollow?host=db1:26257&host=db2:26258"
                                               "&target_session_attrs=prefer-standby&sslmode=require"))
    assert (arguments["host"], arguments["port"]) == (["db1", "db2"], [26257, 26258])
    assert arguments["target_session_attrs"] == "prefer-standby"
    assert arguments["dsn"] == "postgresql://?sslmode=require"


def test_anything_else_is_a_config_error() -> None:
    """An SQLite or MySQL URL, or a malformed one, is one line naming the form to use or the problem."""
    with pytest.raises(ConfigError, match="postgresql://USER@HOST:PORT/DB"):
        HollowSource("sqlite:///hollow.db")
    with pytest.raises(ConfigError, match="port 'x' is not a number"):
        HollowSource("postgresql://u@h1:5432,h2:x/hollow")
