"""Property: no stored record can make a renderer raise (a renderer error is a 500 on every read).

Hypothesis draws Equinix-shaped documents: the keys renderers read, each holding either a
plausible value or any JSON value at all (wrong types, surrogates, NaN, huge numbers,
nesting). Each document goes through the admin API's validation (``parse_metadata_write``);
every flavor is then rendered, fully, for the documents it accepts, and also for the ones
it refuses, since records stored before a check existed must still render. Examples are
bounded and derandomized, so the run is deterministic and takes seconds.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from imds.errors import InvalidInput
from imds.models import Instance
from imds.services.drives import CONFIG_2, NOCLOUD, image
from imds.services.identity.document import IdentitySigner
from imds.services.records.wire import parse_metadata_write
from imds.services.render import ec2, openstack
from imds.services.render.json import metadata_bytes
from imds.services.render.nocloud import nocloud_tree
from imds.services.render.seeds import SEED_BYTES
from imds.services.render.templates import compile_all
from imds.services.render.tree import Dir, body, walk

INSTANCE_ID = "3f2504e0-4f89-11d3-9a0c-0305e82c3301"
TEMPLATES = compile_all({"api_url": "https://{{.facility}}.example/{{.id}}", "phone_home_url": "{{.network.dns}}"})
WHEN = dt.datetime(2026, 11, 23, tzinfo=dt.UTC)

scalars = (
    st.none() | st.booleans() | st.integers() | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
    | st.sampled_from(["\ud800", "z\udfff", "²", "٣", "", " ", "a=b", "=x", "k=", "/a=b", "\n"])
)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def either(plausible: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a plausible value, sometimes any JSON value."""
    return st.one_of(plausible, plausible, plausible, json_values)


def fields(**strategies: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """An object with any subset of these keys."""
    return st.fixed_dictionaries({}, optional={k: either(v) for k, v in strategies.items()})


ips = st.sampled_from(["10.0.0.5", "10.0.0.6", "192.0.2.1", "2001:db8::5", "fe80::1", "::ffff:10.0.0.9", "x",
                       "300.1.1.1"])
macs = st.sampled_from(["aa:bb:cc:dd:ee:01", "AA:BB:CC:DD:EE:02", "40:a6:b7:74:9f:10", "zz"])
masks = st.sampled_from(["255.255.255.0", "24", "²", "ffff:ffff::", "", "0.0.0.0", "1000"])  # noqa: S104 - a netmask
names = st.sampled_from(["eth0", "eth1", "bond0", "vlan5", ""])
address = fields(
    address=ips, address_family=st.sampled_from([4, 6, 5, "4", True]), cidr=st.integers(-2, 130),
    public=st.booleans(), enabled=st.booleans(), gateway=ips, network=ips, netmask=masks, id=st.text(max_size=4),
)
interface = fields(name=names, mac=macs, bond=names, mtu=st.integers(0, 9000))
network = fields(
    addresses=st.lists(address, max_size=4), interfaces=st.lists(interface, max_size=3),
    bonding=fields(mode=st.integers(-1, 8), mac=macs), dns=st.lists(ips, max_size=2),
    nameservers=st.lists(ips, max_size=2),
)
link = fields(
    id=names, type=st.sampled_from(["phy", "bond", "vlan", "ovs", ""]), name=names,
    bond_links=st.lists(names, max_size=2), bond_mode=st.sampled_from(["802.3ad", "active-backup"]),
    bond_miimon=st.integers(0, 200), bond_xmit_hash_policy=st.text(max_size=6), vlan_link=names,
    vlan_id=st.integers(0, 4096), ethernet_mac_address=macs, vlan_mac_address=macs, mtu=st.integers(0, 9000),
)
route = fields(network=ips, netmask=masks, gateway=ips)
os_network = fields(
    id=st.text(max_size=4), link=names, type=st.sampled_from(["ipv4", "ipv6", "ipv4_dhcp", "ipv6_slaac", "dhcp4"]),
    ip_address=ips, netmask=masks, routes=st.lists(route, max_size=2),
)
network_data = fields(
    links=st.lists(link, max_size=3), networks=st.lists(os_network, max_size=3),
    services=st.lists(fields(type=st.sampled_from(["dns", "ntp"]), address=ips), max_size=2),
)
keys = st.sampled_from(["ssh-ed25519 AAAAC3 me@host", "ssh-rsa AAAAB3 me@host", "ssh-rsa AAAAB3", " ", "x y z w"])
documents = fields(
    id=st.sampled_from([INSTANCE_ID, INSTANCE_ID.upper(), "other"]), hostname=st.text(max_size=10),
    name=st.text(max_size=6), plan=st.sampled_from(["c3.small.x86", "c3.large.arm64"]), iqn=st.text(max_size=6),
    facility=st.sampled_from(["da11", "z", "us-west-2a", ""]), metro=st.sampled_from(["da", "sv"]),
    region=st.text(max_size=6), availability_zone=st.text(max_size=6),
    tags=st.lists(st.text(max_size=6) | st.sampled_from(["a=b", "k/x=y", "=v"]), max_size=3),
    ssh_keys=st.lists(keys, max_size=3),
    operating_system=fields(slug=st.text(max_size=6), distro=st.text(max_size=6), image_tag=st.text(max_size=6),
                            version=st.text(max_size=4), license_activation=fields(state=st.text(max_size=4))),
    spot=fields(termination_time=st.text(max_size=8)), storage=fields(disks=st.lists(fields(device=st.text()))),
    network=network, network_data=network_data, private_subnets=st.lists(ips | st.just("10.0.0.0/8"), max_size=2),
    meta=st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2), launch_index=st.integers(),
    project_id=st.text(max_size=6), dedicated_cpus=st.lists(st.integers(0, 64), max_size=3),
    devices=st.lists(st.dictionaries(st.text(max_size=5), scalars, max_size=3), max_size=2),
    vendor_data=fields(**{"cloud-init": st.text(max_size=10)}), updated_at=st.sampled_from(["2026-01-01T00:00:00Z"]),
)


@pytest.fixture(scope="module")
def signer() -> IdentitySigner:
    """One generated identity key for the whole module (RSA generation is the slow part)."""
    return IdentitySigner.load(key_file=None, cert_file=None, data_dir=None)


def render_everything(instance: Instance, signer: IdentitySigner) -> int:
    """Every byte every flavor would serve for ``instance``, and both drive images; how many nodes."""
    served = [metadata_bytes(instance, TEMPLATES)]
    trees: list[Dir] = [ec2.version_root(instance, version, signer) for version in ec2.VERSIONS]
    trees += [openstack.version_dir(instance, version) for version in openstack.VERSIONS]
    trees.append(nocloud_tree(instance))
    for tree in trees:
        for _path, node in walk(tree):
            served.append(body(node))
            if isinstance(node, openstack.SeededJson):
                served.append(node.with_seed(b"\x00" * SEED_BYTES))
    served.extend(image(instance, fmt) for fmt in (CONFIG_2, NOCLOUD))
    return len(served)


@settings(max_examples=250, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(document=documents, userdata=st.none() | st.binary(max_size=16))
def test_no_document_makes_any_flavor_raise(signer, document, userdata):
    """Accepted or not (older records were stored unchecked), every flavor renders every node without raising."""
    try:
        accepted = parse_metadata_write({"id": INSTANCE_ID, "ipAddresses": ["10.0.0.5"], "metadata": document})
    except InvalidInput:
        event("refused by the admin API")
        stored = document
    else:
        event("accepted by the admin API")
        stored = accepted.metadata
    instance = Instance(INSTANCE_ID, metadata=stored, metadata_updated_at=WHEN, userdata=userdata)
    assert render_everything(instance, signer) > 0
