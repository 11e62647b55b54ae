"""Address parsing, normalisation and the longest-prefix-match index."""

from __future__ import annotations

import ipaddress

import pytest

from imds.services.catalog.addresses import AddressIndex, display, parse_host, parse_network


def net(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(text)


def addr(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


# --- parse_network: what the admin API stores --------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.1.2.3", "10.1.2.3/32"),
        ("10.1.2.3/32", "10.1.2.3/32"),
        ("10.1.2.0/24", "10.1.2.0/24"),
        ("10.1.2.0/255.255.255.0", "10.1.2.0/24"),
        ("10.1.2.0/0.0.0.255", "10.1.2.0/24"),
        ("0.0.0.0/0", "0.0.0.0/0"),
        ("2001:db8::1", "2001:db8::1/128"),
        ("2001:DB8::1", "2001:db8::1/128"),
        ("2001:0db8:0000:0000:0000:0000:0000:0001", "2001:db8::1/128"),
        ("2001:db8:0:0:0:0:0:1", "2001:db8::1/128"),
        ("2001:db8::/64", "2001:db8::/64"),
        ("2001:DB8:0:0:0::/48", "2001:db8::/48"),
        ("::1", "::1/128"),
        ("::ffff:10.1.2.3", "10.1.2.3/32"),
        ("::FFFF:10.1.2.3", "10.1.2.3/32"),
        ("::ffff:a01:203", "10.1.2.3/32"),
        ("0:0:0:0:0:ffff:10.1.2.3", "10.1.2.3/32"),
        ("::ffff:10.1.0.0/112", "10.1.0.0/16"),
        ("::ffff:10.1.2.0/120", "10.1.2.0/24"),
    ],
)
def test_parse_network_normalises_every_valid_textual_form(text, expected):
    """Hosts become /32 or /128, v6 is compressed lower-case, masks become prefixes and v4-mapped v6 is v4."""
    assert parse_network(text) == net(expected)
    assert str(parse_network(text)) == expected


@pytest.mark.parametrize(
    ("text", "network", "host"),
    [
        ("10.1.2.3/24", "10.1.2.0/24", "10.1.2.3"),
        ("10.1.2.3/8", "10.0.0.0/8", "10.1.2.3"),
        ("10.1.2.3/255.255.255.0", "10.1.2.0/24", "10.1.2.3"),
        ("2001:db8::abcd/64", "2001:db8::/64", "2001:db8::abcd"),
        ("::ffff:10.1.2.3/120", "::ffff:a01:200/120", "::ffff:a01:203"),
    ],
)
def test_parse_network_refuses_host_bits_instead_of_widening(text, network, host):
    """10.1.2.3/8 is never silently stored as 10.0.0.0/8: the message offers both readings."""
    with pytest.raises(ValueError, match="has host bits set") as raised:
        parse_network(text)
    assert f"write the network {network} or the host {host}" in str(raised.value)


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "010.1.2.3",
        "10.01.2.3",
        "256.1.1.1",
        "10.1.2",
        "10",
        "10.1.2.3/33",
        "10.1.2.3/-1",
        "10.1.2.3/",
        "2001:db8::1/129",
        "2001:db8:::1",
        "fe80::1%eth0",
        "fe80::1%1/64",
        " 10.1.2.3",
        "10.1.2.3 ",
        "example.com",
        "1.2.3.4:80",
        "[::1]",
    ],
)
def test_parse_network_rejects_invalid_text_with_a_readable_message(text):
    """Leading zeros, out-of-range parts, bad prefixes, zone ids, padding and ports are refused, quoting the value."""
    with pytest.raises(ValueError, match="is not an IP address or CIDR") as caught:
        parse_network(text)
    assert repr(text) in str(caught.value)


def test_v4_mapped_network_with_a_prefix_inside_the_mapping_maps_to_zero_length():
    """``::ffff:0:0/96`` covers every v4-mapped address, so it is 0.0.0.0/0."""
    assert parse_network("::ffff:0.0.0.0/96") == net("0.0.0.0/0")


def test_non_mapped_v6_networks_stay_v6():
    """A v6 network that merely contains the mapped range is not converted."""
    assert parse_network("::/64") == net("::/64")


# --- parse_host: what a socket peer or X-Forwarded-For entry says ------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.1.2.3", "10.1.2.3"),
        (" 10.1.2.3 ", "10.1.2.3"),
        ("10.1.2.3:8080", "10.1.2.3"),
        ("2001:db8::1", "2001:db8::1"),
        ("2001:DB8:0:0:0:0:0:1", "2001:db8::1"),
        ("[2001:db8::1]", "2001:db8::1"),
        ("[2001:db8::1]:443", "2001:db8::1"),
        ("fe80::1%eth0", "fe80::1"),
        ("[fe80::1%eth0]:80", "fe80::1"),
        ("::ffff:10.1.2.3", "10.1.2.3"),
        ("[::ffff:10.1.2.3]:80", "10.1.2.3"),
        ("::1", "::1"),
    ],
)
def test_parse_host_accepts_ports_brackets_zones_and_unwraps_v4_mapped(text, expected):
    """Caller addresses come with ports, brackets and zones; the address itself is what counts."""
    assert parse_host(text) == addr(expected)


@pytest.mark.parametrize(
    "text", ["", "unknown", "010.1.2.3", "10.1.2.3/32", "[::1", "1.2.3.4:80:90", "300.1.1.1", "_hidden"]
)
def test_parse_host_returns_none_for_anything_that_is_not_an_address(text):
    """Garbage, leading zeros, CIDRs and unbalanced brackets are not an address."""
    assert parse_host(text) is None


def test_display_shows_hosts_bare_and_networks_with_prefix():
    """The API shows ``10.0.0.1`` and ``10.0.0.0/24``, ``2001:db8::1`` and ``2001:db8::/64``."""
    assert display(net("10.0.0.1/32")) == "10.0.0.1"
    assert display(net("10.0.0.0/24")) == "10.0.0.0/24"
    assert display(net("2001:db8::1/128")) == "2001:db8::1"
    assert display(net("2001:db8::/64")) == "2001:db8::/64"
    assert display(net("0.0.0.0/0")) == "0.0.0.0/0"


# --- AddressIndex ---------------------------------------------------------------------------


def overlapping_index() -> AddressIndex:
    index = AddressIndex()
    index.assign("a", (net("10.0.0.0/8"), net("2001:db8::/32")))
    index.assign("b", (net("10.1.0.0/16"), net("2001:db8:1::/48")))
    index.assign("c", (net("10.1.2.3/32"), net("2001:db8:1::3/128")))
    return index


@pytest.mark.parametrize(
    ("caller", "holder"),
    [
        ("10.9.9.9", "a"),
        ("10.0.0.0", "a"),
        ("10.255.255.255", "a"),
        ("10.1.9.9", "b"),
        ("10.1.0.0", "b"),
        ("10.1.2.2", "b"),
        ("10.1.2.3", "c"),
        ("10.1.2.4", "b"),
        ("11.0.0.1", None),
        ("2001:db8:ffff::1", "a"),
        ("2001:db8:1::9", "b"),
        ("2001:db8:1::3", "c"),
        ("2001:db9::1", None),
        ("::a01:203", None),
    ],
)
def test_lookup_is_longest_prefix_match_over_v4_and_v6(caller, holder):
    """Overlapping CIDRs and hosts: the most specific one containing the caller wins, per IP version."""
    assert overlapping_index().lookup(addr(caller)) == holder


def test_empty_index_finds_nothing():
    """No addresses, no holder, for either version."""
    index = AddressIndex()
    assert index.lookup(addr("10.0.0.1")) is None
    assert index.lookup(addr("::1")) is None
    assert len(index) == 0


def test_default_routes_catch_everything_of_their_version_only():
    """0.0.0.0/0 matches every v4 caller and no v6 caller."""
    index = AddressIndex()
    index.assign("any4", (net("0.0.0.0/0"),))
    assert index.lookup(addr("203.0.113.9")) == "any4"
    assert index.lookup(addr("2001:db8::1")) is None
    index.assign("any6", (net("::/0"),))
    assert index.lookup(addr("2001:db8::1")) == "any6"


def test_assign_replaces_the_whole_list():
    """Addresses the new list omits are no longer the instance's."""
    index = AddressIndex()
    index.assign("a", (net("10.0.0.1/32"), net("10.0.0.2/32")))
    index.assign("a", (net("10.0.0.2/32"), net("10.0.0.3/32")))
    assert index.lookup(addr("10.0.0.1")) is None
    assert index.lookup(addr("10.0.0.2")) == "a"
    assert index.lookup(addr("10.0.0.3")) == "a"
    assert len(index) == 2


def test_assign_moves_an_address_from_its_previous_holder():
    """Last write wins: the address moves; the previous holder keeps its other addresses."""
    index = AddressIndex()
    index.assign("a", (net("10.0.0.1/32"), net("10.0.0.2/32")))
    index.assign("b", (net("10.0.0.1/32"),))
    assert index.lookup(addr("10.0.0.1")) == "b"
    assert index.lookup(addr("10.0.0.2")) == "a"
    assert len(index) == 2


def test_previous_holder_reassigning_does_not_steal_back_or_remove_a_moved_address():
    """After a move, the old holder's next write (without it) leaves the new holder's entry alone."""
    index = AddressIndex()
    index.assign("a", (net("10.0.0.1/32"), net("10.0.0.2/32")))
    index.assign("b", (net("10.0.0.1/32"),))
    index.assign("a", (net("10.0.0.3/32"),))
    assert index.lookup(addr("10.0.0.1")) == "b"
    assert index.lookup(addr("10.0.0.2")) is None
    assert index.lookup(addr("10.0.0.3")) == "a"


def test_forget_removes_only_that_instances_addresses():
    """Forgetting a moved-from instance keeps the address with its new holder."""
    index = AddressIndex()
    index.assign("a", (net("10.0.0.1/32"), net("10.0.0.0/24")))
    index.assign("b", (net("10.0.0.1/32"),))
    index.forget("a")
    assert index.lookup(addr("10.0.0.1")) == "b"
    assert index.lookup(addr("10.0.0.9")) is None
    index.forget("b")
    assert index.lookup(addr("10.0.0.1")) is None
    assert len(index) == 0
    index.forget("never-seen")
    assert len(index) == 0


def test_forgetting_the_most_specific_prefix_falls_back_to_the_next():
    """When the /32 goes, the covering /16 and then /8 answer again."""
    index = overlapping_index()
    index.forget("c")
    assert index.lookup(addr("10.1.2.3")) == "b"
    assert index.lookup(addr("2001:db8:1::3")) == "b"
    index.forget("b")
    assert index.lookup(addr("10.1.2.3")) == "a"
    index.forget("a")
    assert index.lookup(addr("10.1.2.3")) is None
    assert index._tables == {}
    assert index._lengths == {4: [], 6: []}


def test_same_network_value_with_different_prefixes_are_distinct_entries():
    """10.0.0.0/8 and 10.0.0.0/16 can belong to different instances."""
    index = AddressIndex()
    index.assign("wide", (net("10.0.0.0/8"),))
    index.assign("narrow", (net("10.0.0.0/16"),))
    assert index.lookup(addr("10.0.5.5")) == "narrow"
    assert index.lookup(addr("10.5.5.5")) == "wide"


def test_v4_and_v6_with_equal_integer_values_do_not_collide():
    """``0.0.0.1`` and ``::1`` share an integer but not a table."""
    index = AddressIndex()
    index.assign("v4", (net("0.0.0.1/32"),))
    index.assign("v6", (net("::1/128"),))
    assert index.lookup(addr("0.0.0.1")) == "v4"
    assert index.lookup(addr("::1")) == "v6"
