"""Meta address pool: offsets, stored values read back, exhaustion."""

from __future__ import annotations

import ipaddress

import pytest

from imds.agent.allocate import Pool, allocate, format_mac, parse_mac
from imds.errors import ConfigError, PoolExhausted

POOL = Pool.parse("240.0.0.0/16", "fd00:a9fe::/64", "fa:16:ee:00:00:00")


def test_gateway_is_the_first_host_with_mac_01():
    """tap-meta gets 240.0.0.1, fd00:a9fe::1 and fa:16:ee:00:00:01."""
    gw = POOL.gateway
    assert (str(gw.ip), str(gw.ip6), gw.mac) == ("240.0.0.1", "fd00:a9fe::1", "fa:16:ee:00:00:01")


def test_new_ports_get_the_lowest_free_offsets_in_name_order():
    """Unallocated ports are served from offset 2 up, sorted by name, skipping taken offsets."""
    given = allocate(POOL, {"tap-b": None, "tap-a": None, "tap-c": 3})
    assert {k: (str(v.ip), v.mac) for k, v in given.items() if not isinstance(v, PoolExhausted)} == {
        "tap-a": ("240.0.0.2", "fa:16:ee:00:00:02"),
        "tap-b": ("240.0.0.4", "fa:16:ee:00:00:04"),
        "tap-c": ("240.0.0.3", "fa:16:ee:00:00:03"),
    }


def test_stored_addresses_are_kept_and_duplicates_reallocated():
    """A stored offset is kept; a second port claiming the same one gets a fresh address."""
    given = allocate(POOL, {"tap-a": 9, "tap-b": 9})
    assert given["tap-a"].ip == ipaddress.IPv4Address("240.0.0.9")  # type: ignore[union-attr]
    assert given["tap-b"].ip == ipaddress.IPv4Address("240.0.0.2")  # type: ignore[union-attr]


def test_offset_of_reads_back_only_valid_stored_ips():
    """provider_ip outside the range, the gateway, garbage or absent count as unallocated."""
    assert POOL.offset_of("240.0.1.2") == 258
    for bad in (None, "", "10.0.0.1", "240.0.0.1", "240.0.0.0", "not-an-ip", "240.0.255.255"):
        assert POOL.offset_of(bad) is None


def test_exhaustion_is_a_clear_error_per_port_and_the_rest_are_served():
    """A /30 holds one VM: the second port gets PoolExhausted naming the range and the flag."""
    small = Pool.parse("240.0.0.0/30", "fd00:a9fe::/64", "fa:16:ee:00:00:00")
    assert small.capacity == 1
    given = allocate(small, {"tap-a": None, "tap-b": None})
    assert str(given["tap-a"].ip) == "240.0.0.2"  # type: ignore[union-attr]
    error = given["tap-b"]
    assert isinstance(error, PoolExhausted)
    assert "240.0.0.0/30" in error.message
    assert "--provider-cidr" in error.message


def test_mac_space_limits_capacity():
    """Meta MACs never carry into the base's first three octets, which can leave fewer than the IPv4 range."""
    pool = Pool.parse("240.0.0.0/16", "fd00:a9fe::/64", "fa:16:ee:ff:ff:f0")
    assert pool.capacity == 14
    # Not multicast: the group bit (lowest bit of the first octet) decides.
    with pytest.raises(ConfigError, match="multicast"):
        Pool.parse("240.0.0.0/16", "fd00:a9fe::/64", "01:00:5e:00:00:00")


@pytest.mark.parametrize(
    ("cidr", "cidr6", "mac", "flag"),
    [
        ("240.0.0.1/16", "fd00:a9fe::/64", "fa:16:ee:00:00:00", "--provider-cidr"),
        ("240.0.0.0/31", "fd00:a9fe::/64", "fa:16:ee:00:00:00", "--provider-cidr"),
        ("240.0.0.0/16", "nonsense", "fa:16:ee:00:00:00", "--provider-cidr6"),
        ("240.0.0.0/16", "fd00:a9fe::/64", "fa:16:ee:00:00", "--provider-base-mac"),
    ],
)
def test_bad_ranges_name_their_flag(cidr, cidr6, mac, flag):
    """Invalid provider settings are ConfigErrors naming the flag."""
    with pytest.raises(ConfigError, match=flag):
        Pool.parse(cidr, cidr6, mac)


def test_mac_round_trip():
    """MAC text and integers convert both ways."""
    assert format_mac(parse_mac("FA:16:EE:00:01:0a")) == "fa:16:ee:00:01:0a"
