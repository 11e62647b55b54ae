"""The compact catalog keeps the old semantics: index, lazily parsed documents, bounded render cache."""

from __future__ import annotations

import copy
import ipaddress
import random
from datetime import UTC, datetime

from helpers import fixture_json
from imds.models import Address, Instance, Network
from imds.services.catalog.addresses import AddressIndex, pack_network, parse_host, parse_network, unpack_network
from imds.services.catalog.entry import Entry, RenderCache, approximate_size
from imds.services.render.context import Context
from imds.services.render.ec2 import VERSIONS, version_root
from imds.services.render.json import metadata_bytes
from imds.services.render.tree import Dir
from imds.store.interface import stored_form


class ReferenceIndex:
    """The index semantics spelled out naively: each network has one holder, longest prefix wins."""

    def __init__(self) -> None:
        self.holder: dict[Network, str] = {}

    def assign(self, instance_id: str, addresses: tuple[Network, ...]) -> None:
        for network in [n for n, held in self.holder.items() if held == instance_id and n not in addresses]:
            del self.holder[network]
        for network in addresses:
            self.holder[network] = instance_id

    def lookup(self, address: Address) -> str | None:
        matches = [n for n in self.holder if n.version == address.version and address in n]
        return self.holder[max(matches, key=lambda n: n.prefixlen)] if matches else None


def random_network(rng: random.Random) -> Network:
    if rng.random() < 0.5:
        value = rng.choice((0x0A000000, 0x0A010000, 0xC0A80000)) | rng.getrandbits(8)
        prefix = rng.choice((32, 32, 32, 24, 16, 8, 30))
        return ipaddress.IPv4Network((value, prefix), strict=False)
    value = (0x20010DB8 << 96) | rng.getrandbits(8)
    prefix = rng.choice((128, 128, 128, 120, 64, 48))
    return ipaddress.IPv6Network((value, prefix), strict=False)


def random_address(rng: random.Random) -> Address:
    network = random_network(rng)
    address = network.network_address + rng.getrandbits(2)
    return address if address in network else network.network_address


def test_compact_index_agrees_with_the_naive_longest_prefix_match_on_random_operations():
    """10,000 seeded random assigns/forgets over overlapping v4/v6 CIDRs: every lookup agrees."""
    rng = random.Random(1234)  # noqa: S311 - seeded test data, not secrets
    index, reference = AddressIndex(), ReferenceIndex()
    ids = [f"i-{n}" for n in range(40)]
    for _ in range(10_000):
        instance_id = rng.choice(ids)
        addresses = () if rng.random() < 0.1 else tuple({random_network(rng) for _ in range(rng.randint(1, 3))})
        index.assign(instance_id, addresses)
        reference.assign(instance_id, addresses)
        probe = random_address(rng)
        assert index.lookup(probe) == reference.lookup(probe), probe
    for network in reference.holder:
        assert index.lookup(network.network_address) == reference.lookup(network.network_address)


def test_v4_mapped_callers_find_the_v4_holder_in_the_compact_index():
    """``::ffff:10.0.0.5`` is 10.0.0.5 at the write and at the read."""
    index = AddressIndex()
    index.assign("mapped", (parse_network("::ffff:10.0.0.5"),))
    assert index.lookup(parse_host("::ffff:10.0.0.5")) == "mapped"  # type: ignore[arg-type]
    assert index.lookup(parse_host("10.0.0.5")) == "mapped"  # type: ignore[arg-type]


def test_packed_networks_round_trip():
    """Every packed network unpacks to itself, v4 and v6 with equal integers kept apart."""
    rng = random.Random(7)  # noqa: S311 - seeded test data, not secrets
    networks = [random_network(rng) for _ in range(500)] + [parse_network("0.0.0.1"), parse_network("::1")]
    assert [unpack_network(pack_network(n)) for n in networks] == networks
    assert pack_network(parse_network("0.0.0.1")) != pack_network(parse_network("::1"))


def sample_instance(n: int) -> Instance:
    document = fixture_json("metadata-example.json")
    document["id"] = f"inst-{n}"
    document["hostname"] = f"host-{n}.example"
    document["notes"] = "ünïcödé ✓ " * (n % 3)
    return Instance(
        f"inst-{n}", (parse_network(f"10.0.{n // 256}.{n % 256}"), parse_network(f"2001:db8::{n:x}")),
        document, datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), b"#!/bin/sh\necho hi\n",
        datetime(2026, 1, 2, 3, 4, 6, tzinfo=UTC),
    )


def test_a_lazily_parsed_document_is_the_instance_and_renders_identically():
    """The entry rebuilds an equal Instance from its packed form; the rendering and ETag match."""
    cache = RenderCache(1 << 20)
    originals = [sample_instance(n) for n in range(3)]
    entries = [Entry(stored_form(copy.deepcopy(instance)), cache) for instance in originals]
    for original, entry in zip(originals, entries, strict=True):
        assert entry.addresses == original.addresses
        assert entry.instance == original
        assert entry.render("json/metadata", lambda found: metadata_bytes(found, ())) == metadata_bytes(original, ())
        assert entry.etag == Entry(stored_form(original), RenderCache(0)).etag


def test_the_render_cache_evicts_under_its_bound_and_a_rerender_is_byte_identical():
    """Renderings beyond the byte bound are evicted oldest first; rebuilding gives the same bytes."""
    cache = RenderCache(60_000)
    entries = [Entry(stored_form(sample_instance(n)), cache) for n in range(40)]
    builds: list[str] = []

    def build(instance: Instance) -> bytes:
        builds.append(instance.id)
        return metadata_bytes(instance, ())

    first = [entry.render("json/metadata", build) for entry in entries]
    assert cache.bytes <= cache.max_bytes
    assert 1 <= len(cache) < len(entries)  # something was evicted, the newest kept
    assert builds == [entry.id for entry in entries]
    builds.clear()
    again = entries[0].render("json/metadata", build)  # evicted long ago: rebuilt
    assert builds == ["inst-0"]
    assert again == first[0]
    assert entries[-1].render("json/metadata", build) == first[-1]  # the newest is still cached
    assert builds == ["inst-0"]


def test_recent_reads_keep_an_entry_cached_and_a_tree_is_charged_by_its_content():
    """An entry read again moves to the back of the line; trees count their text."""
    cache = RenderCache(100_000)  # a few materialised instances (each charged ~6 bytes per byte of its JSON)
    hot, *cold = [Entry(stored_form(sample_instance(n)), cache) for n in range(20)]
    tree = hot.render("tree", lambda _: Dir({"a": "x" * 1000, "b": Dir({"c": b"y" * 1000})}))
    for entry in cold:
        hot.render("tree", lambda _: Dir())  # a cached read: the build is not called
        entry.render("small", lambda _: b"z")
    assert hot.render("tree", lambda _: Dir()) is tree
    assert cache.bytes <= cache.max_bytes
    assert len(cache) < len(cold)  # the cold entries were evicted around the hot one
    assert cache._held[hot] >= 2000  # the tree's text is charged


def reference_size(value: object) -> int:
    """The render cache's byte estimate as first defined: recursive, text lengths plus 100 per node."""
    if isinstance(value, bytes | str):
        return len(value) + 100
    if isinstance(value, Dir):
        return 100 + sum(len(key) + reference_size(child) for key, child in value.items())
    return 100


def test_the_size_estimate_of_a_rendering_is_the_recursive_one():
    """``approximate_size`` walks with a stack and counts what the recursive definition counts, node for node."""
    signer = _Signer()
    instance = Instance("i-1", metadata=fixture_json("metadata-example.json"), userdata=b"#!/bin/sh\n")
    trees = [version_root(instance, version, signer, Context()) for version in VERSIONS]
    odd = Dir([("a", Dir([("b", b"\xff"), ("c", Dir(bare=True)), ("n", 5)])), ("", "")])  # type: ignore[list-item]
    for value in (*trees, odd, Dir(), "text", b"bytes", 7, None):
        assert approximate_size(value) == reference_size(value)
    assert approximate_size(trees[-1]) > 2000  # the whole tree counted, not its top


class _Signer:
    """Signatures made when read (``Later`` leaves): what is counted, not what is signed."""

    def pkcs7_of(self, document: bytes) -> str:
        return "p" * (2 * len(document))

    def signature_of(self, document: bytes) -> str:
        return "s" * len(document)
