"""The --map file: both formats, errors naming the entry, reload keeping the last good table."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from imds.errors import ConfigError
from imds.proxy.identify import Identity
from imds.proxy.mapfile import MapIdentifier, parse_map

pytestmark = pytest.mark.anyio


def test_json_with_plain_ids_and_objects():
    table = parse_map('{"10.0.0.5": "a", "fd00::6": {"instance_id": "b", "tenant_id": "t"}, "::ffff:10.0.0.7": "c"}')
    assert table == {
        ipaddress.ip_address("10.0.0.5"): Identity("a"),
        ipaddress.ip_address("fd00::6"): Identity("b", "t"),
        ipaddress.ip_address("10.0.0.7"): Identity("c"),  # IPv4-mapped IPv6 is the IPv4 address
    }


def test_lines_with_comments_and_optional_tenant():
    table = parse_map("# header\n\n10.0.0.5 a\n10.0.0.6 b t  # trailing comment\nfe80::1%eth0 c\n")
    assert table == {
        ipaddress.ip_address("10.0.0.5"): Identity("a"),
        ipaddress.ip_address("10.0.0.6"): Identity("b", "t"),
        ipaddress.ip_address("fe80::1"): Identity("c"),
    }


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('{"10.0.0.5": ', "invalid JSON"),
        ('{"not-an-ip": "a"}', "'not-an-ip' is not an IP address"),
        ('{"10.0.0.5": 7}', "10.0.0.5: expected an instance id"),
        ('{"10.0.0.5": {"instance_id": "a", "tenant_id": 3}}', "tenant_id must be a string"),
        ("10.0.0.5 a\n10.0.0.6\n", "map:2: expected ADDRESS INSTANCE_ID"),
        ("10.0.0.5 a b c\n", "map:1:"),
    ],
)
def test_errors_name_the_entry(text, named):
    with pytest.raises(ConfigError, match=named):
        parse_map(text)


async def test_reload_keeps_the_last_good_table(tmp_path: Path):
    path = tmp_path / "map"
    path.write_text("10.0.0.5 a\n")
    identifier = MapIdentifier(path, poll_interval=0)
    await identifier.start()
    try:
        address = ipaddress.ip_address("10.0.0.5")
        assert await identifier.identify(address) == Identity("a")
        path.write_text("{broken")
        assert identifier.reload() is False
        assert await identifier.identify(address) == Identity("a")
        path.write_text("10.0.0.5 b\n")
        assert identifier.reload() is True
        assert await identifier.identify(address) == Identity("b")
        assert await identifier.identify(ipaddress.ip_address("10.0.0.6")) is None
    finally:
        await identifier.stop()


async def test_a_missing_file_fails_at_start(tmp_path: Path):
    with pytest.raises(ConfigError, match="--map"):
        await MapIdentifier(tmp_path / "absent", poll_interval=0).start()
