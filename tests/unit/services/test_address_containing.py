"""``AddressIndex.containing``: every entry holding an address, longest prefix first (``imds explain``)."""

from __future__ import annotations

import ipaddress

from imds.services.catalog.addresses import AddressIndex, parse_network


def test_every_containing_entry_longest_first_v4_and_v6():
    index = AddressIndex()
    index.assign("host", (parse_network("10.1.2.3"), parse_network("2001:db8::5")))
    index.assign("net", (parse_network("10.1.2.0/24"), parse_network("2001:db8::/64")))
    index.assign("wide", (parse_network("10.0.0.0/8"), parse_network("::/0")))
    found = index.containing(ipaddress.ip_address("10.1.2.3"))
    assert [(str(n), h) for n, h in found] == [("10.1.2.3/32", "host"), ("10.1.2.0/24", "net"), ("10.0.0.0/8", "wide")]
    assert index.lookup(ipaddress.ip_address("10.1.2.3")) == found[0][1]
    six = index.containing(ipaddress.ip_address("2001:db8::5"))
    assert [(str(n), h) for n, h in six] == [("2001:db8::5/128", "host"), ("2001:db8::/64", "net"), ("::/0", "wide")]
    assert [h for _, h in index.containing(ipaddress.ip_address("10.9.9.9"))] == ["wide"]
    assert index.containing(ipaddress.ip_address("192.0.2.1")) == []
    index.forget("wide")
    assert [h for _, h in index.containing(ipaddress.ip_address("2001:db8::1"))] == ["net"]
