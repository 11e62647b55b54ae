"""Who is asking: the socket peer, and X-Forwarded-For only from trusted proxies."""

from __future__ import annotations

import ipaddress

import pytest

from imds.errors import InvalidInput
from imds.services.identity.identify import caller_address, is_trusted

PROXIES = (ipaddress.ip_network("192.0.2.0/24"), ipaddress.ip_network("2001:db8:ffff::/48"))


def addr(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def test_without_trusted_proxies_the_peer_is_the_caller_whatever_xff_says():
    """No proxy is trusted by default, so a forged X-Forwarded-For changes nothing."""
    assert caller_address("10.0.0.5", ["10.0.0.9"], ()) == addr("10.0.0.5")


def test_an_untrusted_peer_ignores_xff_even_when_proxies_are_configured():
    """Only a peer inside a trusted network may speak for someone else."""
    assert caller_address("10.0.0.5", ["10.0.0.9"], PROXIES) == addr("10.0.0.5")
    assert caller_address("192.0.3.1", ["10.0.0.9"], PROXIES) == addr("192.0.3.1")


def test_untrusted_peer_with_malformed_xff_is_not_an_error():
    """XFF from an untrusted peer is never parsed."""
    assert caller_address("10.0.0.5", ["garbage, !!"], PROXIES) == addr("10.0.0.5")


def test_trusted_peer_uses_the_right_most_xff_entry():
    """The proxy appended the address it saw last; that entry is the caller."""
    assert caller_address("192.0.2.10", ["10.0.0.9"], PROXIES) == addr("10.0.0.9")


def test_entries_left_of_the_first_untrusted_one_are_ignored():
    """A client can prepend anything; the right-most untrusted entry wins."""
    assert caller_address("192.0.2.10", ["10.6.6.6, 10.0.0.9"], PROXIES) == addr("10.0.0.9")


def test_a_chain_of_trusted_proxies_is_skipped_from_the_right():
    """Trusted hops appended by further proxies are passed over until an untrusted address."""
    header = ["10.6.6.6, 10.0.0.9, 192.0.2.20, 192.0.2.30"]
    assert caller_address("192.0.2.10", header, PROXIES) == addr("10.0.0.9")


def test_multiple_xff_headers_are_one_list_in_order():
    """Repeated headers concatenate, so the last header's last entry is right-most."""
    assert caller_address("192.0.2.10", ["10.6.6.6", "10.0.0.9, 192.0.2.20"], PROXIES) == addr("10.0.0.9")
    assert caller_address("192.0.2.10", ["10.0.0.9, 192.0.2.20", "10.7.7.7"], PROXIES) == addr("10.7.7.7")


def test_trusted_peer_without_xff_is_itself_the_caller():
    """A proxy that forwards nothing is identified as itself."""
    assert caller_address("192.0.2.10", [], PROXIES) == addr("192.0.2.10")
    assert caller_address("192.0.2.10", ["", " , "], PROXIES) == addr("192.0.2.10")


def test_all_trusted_chain_ends_at_the_left_most_proxy():
    """When every entry is a trusted proxy, the left-most one is the best knowledge."""
    assert caller_address("192.0.2.10", ["192.0.2.20, 192.0.2.30"], PROXIES) == addr("192.0.2.20")


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("10.0.0.9:5555", "10.0.0.9"),
        ("[2001:db8::9]:443", "2001:db8::9"),
        ("[2001:db8::9]", "2001:db8::9"),
        ("2001:DB8:0:0:0:0:0:9", "2001:db8::9"),
        ("::ffff:10.0.0.9", "10.0.0.9"),
        ("fe80::9%eth0", "fe80::9"),
        ("  10.0.0.9  ", "10.0.0.9"),
    ],
)
def test_xff_entries_may_carry_ports_brackets_zones_and_any_textual_form(entry, expected):
    """Each entry is reduced to its address before it is judged."""
    assert caller_address("192.0.2.10", [f"10.6.6.6, {entry}"], PROXIES) == addr(expected)


@pytest.mark.parametrize("entry", ["unknown", "10.0.0.300", "010.0.0.9", "_hidden", "[::1", "10.0.0.0/8"])
def test_a_malformed_deciding_entry_is_invalid_input(entry):
    """An unparseable entry where the caller would be read is a 400, not a guess."""
    with pytest.raises(InvalidInput) as caught:
        caller_address("192.0.2.10", [f"10.0.0.9, {entry}"], PROXIES)
    [problem] = caught.value.problems
    assert problem.field == "X-Forwarded-For"
    assert problem.message == f"{entry!r} is not an IP address"


def test_a_malformed_entry_left_of_the_caller_is_ignored():
    """Entries beyond the decision are never read."""
    assert caller_address("192.0.2.10", ["garbage, 10.0.0.9"], PROXIES) == addr("10.0.0.9")


def test_malformed_entry_after_trusted_hops_still_decides():
    """Skipping a trusted hop moves the decision left, onto the malformed entry."""
    with pytest.raises(InvalidInput):
        caller_address("192.0.2.10", ["10.0.0.9, bogus, 192.0.2.20"], PROXIES)


def test_v6_proxies_and_v6_callers():
    """Trust and identification work the same over IPv6."""
    assert caller_address("2001:db8:ffff::1", ["2001:db8:1::5"], PROXIES) == addr("2001:db8:1::5")
    assert caller_address("2001:db8:1::5", ["2001:db8:1::6"], PROXIES) == addr("2001:db8:1::5")


def test_v4_mapped_peer_is_judged_as_v4():
    """A dual-stack socket reports ``::ffff:192.0.2.10``; it is the trusted v4 proxy."""
    assert caller_address("::ffff:192.0.2.10", ["10.0.0.9"], PROXIES) == addr("10.0.0.9")
    assert caller_address("::ffff:10.0.0.5", ["10.0.0.9"], PROXIES) == addr("10.0.0.5")
    assert caller_address("::ffff:10.0.0.5", [], ()) == addr("10.0.0.5")


@pytest.mark.parametrize("peer", [None, "", "unix-socket", "not-an-ip"])
def test_a_peer_that_is_not_an_ip_address_identifies_nobody(peer):
    """No client tuple or a non-IP transport gives no address (and XFF is not consulted)."""
    assert caller_address(peer, ["10.0.0.9"], PROXIES) is None


def test_is_trusted_requires_the_same_ip_version():
    """A v6 address is never inside a v4 network, and vice versa."""
    assert is_trusted(addr("192.0.2.1"), PROXIES)
    assert not is_trusted(addr("192.0.3.1"), PROXIES)
    assert is_trusted(addr("2001:db8:ffff::9"), PROXIES)
    assert not is_trusted(addr("::ffff:192.0.2.1"), PROXIES)
    assert not is_trusted(addr("192.0.2.1"), ())
