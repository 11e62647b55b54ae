"""Hollow's readings, unit by unit: spelled addresses, the wire rules with and without --strict-records, limits."""

from __future__ import annotations

import ipaddress

import pytest

from imds.errors import InvalidInput
from imds.models import SECRET, SpelledIPv4Network, SpelledIPv6Network, covered, stored_network
from imds.services.catalog.addresses import AddressIndex, pack_network, pack_stored, parse_network
from imds.services.explain import explain_address
from imds.services.records.limits import Limits, check_size
from imds.services.records.wire import NoteKind, notes, parse_metadata_write, parse_userdata_write
from imds.services.transfer.bulk import item_notes, parse_item

ID = "316ed337-feee-48c6-a11b-3d4738e3cd6d"
STRICT = Limits(strict_records=True)


def write(**fields):
    return {"id": ID, "ipAddresses": ["10.70.17.9/31"], "metadata": {"id": ID}, **fields}


@pytest.mark.parametrize(("text", "network"), [("10.70.17.9/31", "10.70.17.8/31"), ("192.168.0.1/25", "192.168.0.0/25"),
                                               ("2604:1380:4641:1f00::9/127", "2604:1380:4641:1f00::8/127")])
def test_a_spelled_address_equals_its_network_and_shows_as_sent(text, network):
    """Equal and hashed as the network (one index slot, one holder); str() is the text as sent."""
    parsed = parse_network(text, spelled=True)
    assert isinstance(parsed, SpelledIPv4Network | SpelledIPv6Network)
    assert parsed == ipaddress.ip_network(network)
    assert hash(parsed) == hash(ipaddress.ip_network(network))
    assert (str(parsed), covered(parsed)) == (text, network)
    assert stored_network(text) == parsed
    assert str(stored_network(text)) == text
    assert pack_stored(text) == pack_network(ipaddress.ip_network(network)) == pack_network(parsed)


def test_plain_addresses_are_unchanged():
    """Hosts and networks without host bits are plain networks, normalised, covering nothing else."""
    plain = (("10.0.0.5", "10.0.0.5/32"), ("10.0.0.0/24", "10.0.0.0/24"), ("2001:DB8::/64", "2001:db8::/64"))
    for text, shown in plain:
        parsed = parse_network(text, spelled=True)
        assert type(parsed) in {ipaddress.IPv4Network, ipaddress.IPv6Network}
        assert (str(parsed), covered(parsed)) == (shown, None)
        assert type(stored_network(shown)) is type(parsed)


def test_an_ipv4_mapped_spelled_address_is_its_ipv4_form():
    """::ffff:10.70.17.9/127 is 10.70.17.9/31, as every other mapped address is its IPv4 one."""
    parsed = parse_network("::ffff:10.70.17.9/127", spelled=True)
    assert (str(parsed), covered(parsed)) == ("10.70.17.9/31", "10.70.17.8/31")


def test_host_bits_are_still_refused_by_default():
    """parse_network without ``spelled`` (the trusted-proxy flags, --strict-records) refuses them."""
    with pytest.raises(ValueError, match="has host bits set"):
        parse_network("10.70.17.9/31")


def test_the_index_matches_a_spelled_address_by_containment():
    """Both addresses of the /31 resolve to the holder; a longer prefix inside it still wins."""
    index = AddressIndex()
    index.assign("a", (parse_network("10.70.17.9/31", spelled=True),))
    index.assign("b", (parse_network("10.70.17.9"),))
    assert index.lookup(ipaddress.ip_address("10.70.17.8")) == "a"
    assert index.lookup(ipaddress.ip_address("10.70.17.9")) == "b"
    assert index.lookup(ipaddress.ip_address("10.70.17.10")) is None


def test_the_wire_reads_hollows_forms_by_default_and_says_so():
    """Host bits, a foreign document id and a missing list are accepted; ``notes`` names each reading."""
    other = "37066580-de45-44ea-8cbb-eff3e932e3b1"
    parsed = parse_metadata_write(write(metadata={"id": other}))
    assert [str(a) for a in parsed.addresses] == ["10.70.17.9/31"]
    assert parsed.metadata == {"id": other}
    assert [(note.kind, note.text) for note in notes(parsed)] == [(NoteKind.ADDRESSES,
        ("ipAddresses: 10.70.17.9/31 has host bits set: it covers the network 10.70.17.8/31 "
         "(matched by containment, longest prefix; stored and shown as sent)")), (NoteKind.METADATA,
        (f"metadata.id: {other!r} is not the record id: the document is stored and served as sent; "
         f"every flavor names the instance {ID}")),
    ]
    assert notes(parse_metadata_write(write(metadata={"id": ID.upper()}, ipAddresses=["10.0.0.1"]))) == []
    for missing in ({"ipAddresses": None}, {}):
        body = {k: v for k, v in write(**missing).items() if k != "ipAddresses" or missing}
        assert parse_metadata_write(body).addresses == ()
    assert parse_userdata_write({"id": ID, "userdata": "x"}).addresses == ()


def test_strict_records_refuses_each_reading():
    """--strict-records: the three readings are problems, each under its field."""
    other = "37066580-de45-44ea-8cbb-eff3e932e3b1"
    with pytest.raises(InvalidInput) as caught:
        parse_metadata_write(write(metadata={"id": other}), STRICT)
    assert [p.field for p in caught.value.problems] == ["ipAddresses[0]", "metadata.id"]
    with pytest.raises(InvalidInput) as caught:
        parse_userdata_write({"id": ID, "userdata": "x"}, STRICT)
    assert [p.field for p in caught.value.problems] == ["ipAddresses"]


def test_limits_come_from_the_settings_group():
    """Limits.of reads every field the limits group has; one item may be as large as one admin write."""

    class Group:
        max_addresses, max_document_depth, max_document_keys, max_body_bytes, strict_records = 5, 6, 7, 100, True

    assert Limits.of(Group()) == Limits(5, 6, 7, 100, strict_records=True)
    assert check_size("userdata", 100, Limits(max_body_bytes=100)) is None
    problem = check_size("userdata", 101, Limits(max_body_bytes=100))
    assert problem is not None
    assert problem.message == ("is 101 bytes; at most 100 are accepted, as in one admin write "
                               "(--max-body-bytes / IMDS_MAX_BODY_BYTES)")


def test_an_import_item_is_held_to_the_admin_limits():
    """Userdata or metadata larger than --max-body-bytes is that item's problem, named by field."""
    small = Limits(max_body_bytes=64)
    with pytest.raises(InvalidInput) as caught:
        parse_item({"id": ID, "ipAddresses": [], "userdata": "x" * 65, "userdata_encoding": "text"}, label="line 1",
                   limits=small)
    assert [p.field for p in caught.value.problems] == ["userdata"]
    with pytest.raises(InvalidInput) as caught:
        parse_item({"id": ID, "ipAddresses": [], "metadata": {"blob": "x" * 64}}, label="line 1", limits=small)
    assert [p.field for p in caught.value.problems] == ["metadata"]
    assert parse_item({"id": ID, "ipAddresses": [], "userdata": "x" * 64, "userdata_encoding": "text"},
                      label="line 1", limits=small).userdata is not None


def test_an_import_item_keeps_the_host_named_beside_its_document():
    """``imds import`` reads an item's top-level ``host`` as the admin API does (the document's ``host``)."""
    item = parse_item({"id": ID, "ipAddresses": [], "metadata": {"id": ID}, "host": "compute-7"}, label="line 1")
    assert item.metadata is not None
    assert item.metadata.metadata == {"id": ID, "host": "compute-7"}


def test_an_offline_import_names_each_secret_it_drops():
    """A secret OS value is never stored in the database: item_notes names the parameter (offline only)."""
    item = parse_item({"id": ID, "ipAddresses": ["10.0.0.1"], "metadata": {}, "os": {
        "os_type": "debootstrap+default", "mode": "install", "communication": False,
        "parameters": {"dns": {"value": "10.0.0.2", "visibility": "public"},
                       "root_password": {"value": "hunter2", "visibility": SECRET}}}}, label="line 1")
    dropped = item_notes(item, offline=True)
    assert len(dropped) == 1
    assert dropped[0].kind == NoteKind.OS
    assert dropped[0].text.startswith("os.parameters.root_password: a secret value is never stored in the database")
    assert item_notes(item, offline=False) == []


def test_explaining_an_address_without_a_lookup_configured():
    """An upstream of {"configured": False} has no by-IP cache: the answer says nobody holds it (was KeyError)."""
    found = explain_address(ipaddress.ip_address("10.9.9.9"), [], lambda _id: None, templates=(),
                            upstream={"configured": False})
    assert (found["instance_id"], found["why"]) == (None, "no stored entry contains it: no instance holds 10.9.9.9")
    known = explain_address(ipaddress.ip_address("10.9.9.9"), [], lambda _id: None, templates=(),
                            upstream={"by_ip_cache": {}, "fetched": []})
    assert known["why"].startswith("no stored entry contains it and the upstream lookup has not answered for it")
