"""The EC2 renderers: hollow's 2009-04-04 subset (exact text) and the AWS layout, as pure functions."""

from __future__ import annotations

import copy
import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest

from ec2_expected import ED25519_KEY, HOLLOW_SEED, INSTANCE_ID, REPO, RSA_KEY, seed
from imds.models import Instance
from imds.services.render.ec2 import (
    AWS_VERSIONS,
    HOLLOW_VERSION,
    VERSIONS,
    aws_meta_data,
    hollow_meta_data,
    identity_document,
    placement,
    version_root,
    versions_listing,
)
from imds.services.render.tree import Dir, Later, body, resolve, walk

MAC0 = "40:a6:b7:74:9f:10"
MAC1 = "40:a6:b7:74:9f:11"
# The AWS layout of the same document, every node (see the mapping in render/ec2.py's docstring).
AWS_SEED: dict[str, str] = {
    "": "ami-id\nami-launch-index\nblock-device-mapping/\nhostname\ninstance-action\ninstance-id\n"
    "instance-life-cycle\ninstance-type\nipv6\nlocal-hostname\nlocal-ipv4\nmac\nnetwork/\nplacement/\n"
    "public-hostname\npublic-ipv4\npublic-keys/",
    "ami-id": "31853a2b0b2fcc4ee7fd5da5e53611303b60aafa",
    "ami-launch-index": "0",
    "block-device-mapping": "ami\nroot",
    "block-device-mapping/ami": "/dev/sda",
    "block-device-mapping/root": "/dev/sda",
    "hostname": "metadata-example-01",
    "instance-action": "none",
    "instance-id": "cc40301c-4038-4011-af55-6eae3ba60246",
    "instance-life-cycle": "on-demand",
    "instance-type": "c3.medium.x86",
    "ipv6": "2001:0db8:8583:0000::9",  # the first IPv6 address (systemd-imds reads it)
    "local-hostname": "metadata-example-01",
    "local-ipv4": "10.70.17.9",
    "mac": MAC0,
    "network": "interfaces/",
    "network/interfaces": "macs/",
    "network/interfaces/macs": f"{MAC0}/\n{MAC1}/",
    f"network/interfaces/macs/{MAC0}": "device-number\ninterface-id\nipv6s\nlocal-hostname\nlocal-ipv4s\nmac\n"
    "public-ipv4s\nsubnet-id\nsubnet-ipv4-cidr-block\nsubnet-ipv6-cidr-blocks\nvpc-id",
    f"network/interfaces/macs/{MAC0}/device-number": "0",
    f"network/interfaces/macs/{MAC0}/interface-id": "eni-87fa1ddc40e4d9b6b",
    f"network/interfaces/macs/{MAC0}/subnet-id": "subnet-41cdbacd28c486697",
    f"network/interfaces/macs/{MAC0}/vpc-id": "vpc-3940c2414bc950701",
    f"network/interfaces/macs/{MAC1}/interface-id": "eni-a45d352dbffd8d275",
    f"network/interfaces/macs/{MAC1}/vpc-id": "vpc-3940c2414bc950701",
    f"network/interfaces/macs/{MAC0}/ipv6s": "2001:0db8:8583:0000::9",
    f"network/interfaces/macs/{MAC0}/local-hostname": "metadata-example-01",
    f"network/interfaces/macs/{MAC0}/local-ipv4s": "10.70.17.9",
    f"network/interfaces/macs/{MAC0}/mac": MAC0,
    f"network/interfaces/macs/{MAC0}/public-ipv4s": "40.91.78.229",
    f"network/interfaces/macs/{MAC0}/subnet-ipv4-cidr-block": "10.70.17.8/31",
    f"network/interfaces/macs/{MAC0}/subnet-ipv6-cidr-blocks": "2001:db8:8583::8/127",
    f"network/interfaces/macs/{MAC1}": "device-number\ninterface-id\nlocal-hostname\nmac\nvpc-id",
    f"network/interfaces/macs/{MAC1}/device-number": "1",
    f"network/interfaces/macs/{MAC1}/local-hostname": "metadata-example-01",
    f"network/interfaces/macs/{MAC1}/mac": MAC1,
    "placement": "availability-zone\nregion",
    "placement/availability-zone": "da11",
    "placement/region": "da1",  # the zone minus its last letter, as clients derive it
    "public-hostname": "metadata-example-01",
    "public-ipv4": "40.91.78.229",
    "public-keys": "0=test@testmachine.local\n1=test@testmachine.local-1",
    "public-keys/0": "openssh-key",
    "public-keys/0/openssh-key": ED25519_KEY,
    "public-keys/1": "openssh-key",
    "public-keys/1/openssh-key": RSA_KEY,
}


def without(doc: dict[str, Any], *keys: str) -> dict[str, Any]:
    copied = copy.deepcopy(doc)
    for key in keys:
        copied.pop(key, None)
    return copied


def text_tree(root: Dir) -> dict[str, str]:
    """Every node of ``root`` (and the root itself, as "") as the text a GET would answer."""
    return {"": body(root).decode(), **{path: body(node).decode() for path, node in walk(root)}}


class FakeSigner:
    """Deterministic stand-in for the identity signer: proves what is signed, not how (and how often)."""

    def __init__(self) -> None:
        self.signed: list[tuple[str, bytes]] = []

    def pkcs7_of(self, document: bytes) -> str:
        self.signed.append(("pkcs7", document))
        return f"p7({len(document)})"

    def signature_of(self, document: bytes) -> str:
        self.signed.append(("signature", document))
        return f"sig({len(document)})"


# --- hollow's 2009-04-04 subset ----------------------------------------------------------------------------


def test_the_fixture_is_the_seed_example_document():
    """The fixture the tests read is the seed's example (also shipped as the demo's package data)."""
    doc = seed()
    assert doc["id"] == INSTANCE_ID
    assert doc == json.loads((REPO / "src" / "imds" / "demo" / "metadata.json").read_text())


def test_hollow_tree_of_the_seed_document_is_exactly_hollows_text():
    """Every listing and item of hollow's subset for the seed document, as literal text."""
    assert text_tree(hollow_meta_data(seed())) == HOLLOW_SEED


def test_hollow_lists_subtrees_without_a_trailing_slash():
    """Hollow's documented listing has no '/' on operating-system or license-activation."""
    tree = hollow_meta_data(seed())
    assert tree.bare is True
    for _path, node in walk(tree):
        if isinstance(node, Dir):
            assert node.bare is True
            assert "/" not in node.listing()


@pytest.mark.parametrize(
    ("spot", "termination"),
    [({"termination_time": "20220707T13:13:13Z"}, "20220707T13:13:13Z"), ({}, "")],
)
def test_hollow_lists_spot_after_public_keys_when_the_document_has_a_spot_object(spot, termination):
    """A spot object adds 'spot' (listing 'termination-time') between public-keys and the addresses."""
    tree = hollow_meta_data({**seed(), "spot": spot})
    assert tree.listing() == (
        "instance-id\nhostname\niqn\nplan\nfacility\ntags\noperating-system\npublic-keys\n"
        "spot\npublic-ipv4\npublic-ipv6\nlocal-ipv4"
    )
    assert body(resolve(tree, "spot")) == b"termination-time"  # type: ignore[arg-type]
    assert resolve(tree, "spot/termination-time") == termination


@pytest.mark.parametrize("spot", [None, "soon", ["x"]])
def test_hollow_has_no_spot_without_a_spot_object(spot):
    """No spot key, a null or a non-object spot: 'spot' is neither listed nor served."""
    doc = seed() if spot is None else {**seed(), "spot": spot}
    tree = hollow_meta_data(doc)
    assert "spot" not in tree.listing().splitlines()
    assert resolve(tree, "spot") is None
    assert resolve(tree, "spot/termination-time") is None


def test_hollow_address_keys_follow_family_and_public_flag():
    """public-ipv4, public-ipv6 and local-ipv4 each appear only when a matching address exists, all joined."""
    doc = seed()
    doc["network"]["addresses"] = [
        {"address_family": 4, "public": False, "address": "10.0.0.1"},
        {"address_family": 4, "public": False, "address": "10.0.0.2"},
        {"address_family": 6, "public": False, "address": "fd00::1"},  # private v6: hollow has no key for it
    ]
    tree = hollow_meta_data(doc)
    assert tree.listing().endswith("public-keys\nlocal-ipv4")
    assert resolve(tree, "local-ipv4") == "10.0.0.1\n10.0.0.2"
    assert resolve(tree, "public-ipv4") is None
    assert resolve(tree, "public-ipv6") is None


@pytest.mark.parametrize(
    "network",
    [None, {}, {"addresses": []}, {"addresses": "nope"}, {"addresses": [{"address_family": 4, "public": True}]}],
)
def test_hollow_without_addresses_has_no_address_keys(network):
    """No network, no addresses or unusable entries: none of the three address keys is listed or served."""
    doc = without(seed(), "network") if network is None else {**seed(), "network": network}
    tree = hollow_meta_data(doc)
    assert tree.listing() == "instance-id\nhostname\niqn\nplan\nfacility\ntags\noperating-system\npublic-keys"
    for key in ("public-ipv4", "public-ipv6", "local-ipv4"):
        assert resolve(tree, key) is None


def test_hollow_tags_and_public_keys_are_joined_by_newlines_and_empty_when_absent():
    """Tags and keys are one per line; an empty or missing list is an empty (but present) item."""
    tree = hollow_meta_data({**seed(), "tags": ["a", "b=c"], "ssh_keys": []})
    assert resolve(tree, "tags") == "a\nb=c"
    assert resolve(tree, "public-keys") == ""
    bare = hollow_meta_data({"id": INSTANCE_ID})
    assert resolve(bare, "tags") == ""
    assert resolve(bare, "public-keys") == ""
    assert resolve(bare, "instance-id") == INSTANCE_ID
    assert resolve(bare, "hostname") == ""


def test_hollow_scalars_are_text():
    """Numbers and booleans in scalar fields are served as their text."""
    tree = hollow_meta_data({**seed(), "plan": 3, "facility": True, "iqn": None})
    assert resolve(tree, "plan") == "3"
    assert resolve(tree, "facility") == "true"
    assert resolve(tree, "iqn") == ""


# --- the AWS layout ---------------------------------------------------------------------------------------------


def test_aws_tree_of_the_seed_document_node_by_node():
    """Every node of the AWS meta-data tree for the seed document, as the text a GET answers."""
    assert text_tree(aws_meta_data(seed())) == AWS_SEED


def test_aws_listings_are_derived_from_children():
    """Every directory lists exactly its children: subtrees end in '/', labelled ones show the label."""
    root = aws_meta_data({**seed(), "tags": ["role=web"], "spot": {"termination_time": "t"}})
    dirs = [("", root), *((p, n) for p, n in walk(root) if isinstance(n, Dir))]
    assert len(dirs) > 10
    for _path, node in dirs:
        assert node.bare is False
        expected = [node.labels.get(k) or (k + "/" if isinstance(v, Dir) else k) for k, v in node.items()]
        assert node.listing().split("\n") == expected
        for key in node:
            assert resolve(node, key) is node[key]


def test_aws_values_have_no_trailing_newline_and_every_listed_entry_resolves():
    """No leaf ends in a newline; every line of every listing names a node that resolves."""
    root = aws_meta_data({**seed(), "tags": ["role=web", "env=prod"]})
    for path, node in [("", root), *walk(root)]:
        if isinstance(node, Dir):
            for line in node.listing().splitlines():
                name = line.split("=", 1)[0] if "=" in line else line.rstrip("/")
                assert resolve(root, f"{path}/{name}") is not None, (path, line)
        else:
            assert not body(node).endswith(b"\n"), path


def test_public_keys_are_labelled_index_equals_name_with_unique_names():
    """public-keys/ lists 'N=name' (the key's comment, else key-N); a repeated name gets '-N' so none is hidden."""
    doc = {**seed(), "ssh_keys": ["ssh-rsa AAA alice@host", "ssh-ed25519 BBB", "ssh-rsa CCC alice@host", "  "]}
    tree = aws_meta_data(doc)
    assert resolve(tree, "public-keys").listing() == "0=alice@host\n1=key-1\n2=alice@host-2"  # type: ignore[union-attr]
    assert resolve(tree, "public-keys/0/openssh-key") == "ssh-rsa AAA alice@host"
    assert resolve(tree, "public-keys/1/openssh-key") == "ssh-ed25519 BBB"
    assert resolve(tree, "public-keys/2/openssh-key") == "ssh-rsa CCC alice@host"
    assert resolve(tree, "public-keys/3") is None
    assert resolve(aws_meta_data({**seed(), "ssh_keys": []}), "public-keys") is None


def test_tags_of_the_form_key_equals_value_become_instance_tags():
    """tags/instance/KEY serves VALUE for 'key=value' tags; other tags are left out."""
    doc = {**seed(), "tags": ["role=web", "plain", "k=v=w", "=empty-key", "a/b=slash", "env=", 7]}
    tree = aws_meta_data(doc)
    assert body(resolve(tree, "tags")) == b"instance/"  # type: ignore[arg-type]
    assert body(resolve(tree, "tags/instance")) == b"role\nk\nenv"  # type: ignore[arg-type]
    assert resolve(tree, "tags/instance/role") == "web"
    assert resolve(tree, "tags/instance/k") == "v=w"
    assert resolve(tree, "tags/instance/env") == ""
    assert resolve(aws_meta_data({**seed(), "tags": ["plain"]}), "tags") is None


def test_interfaces_take_the_bond_mac_as_primary_and_addresses_go_to_it():
    """The bond's MAC is 'mac'; only its interface carries the addresses; MACs are lower-cased."""
    doc = seed()
    doc["network"]["bonding"]["mac"] = "40:A6:B7:74:9F:11"
    doc["network"]["interfaces"] = [
        {"name": "eth0", "mac": "40:A6:B7:74:9F:10"},
        {"name": "eth1", "mac": "40:A6:B7:74:9F:11"},
        {"name": "no-mac"},
    ]
    tree = aws_meta_data(doc)
    assert resolve(tree, "mac") == MAC1
    assert body(resolve(tree, "network/interfaces/macs")) == f"{MAC0}/\n{MAC1}/".encode()  # type: ignore[arg-type]
    assert resolve(tree, f"network/interfaces/macs/{MAC1}/local-ipv4s") == "10.70.17.9"
    assert resolve(tree, f"network/interfaces/macs/{MAC1}/device-number") == "1"
    assert resolve(tree, f"network/interfaces/macs/{MAC0}/local-ipv4s") is None
    assert body(resolve(tree, f"network/interfaces/macs/{MAC0}")) == (  # type: ignore[arg-type]
        b"device-number\ninterface-id\nlocal-hostname\nmac\nvpc-id"
    )


def test_every_mac_has_a_vpc_so_cloud_init_does_not_take_the_instance_for_ec2_classic():
    """vpc-id: explicit network.vpc_id wins; else one per project, AWS-shaped; interface and subnet ids are stable."""
    doc = seed()
    tree = aws_meta_data(doc)
    vpcs = {resolve(tree, f"network/interfaces/macs/{mac}/vpc-id") for mac in (MAC0, MAC1)}
    assert len(vpcs) == 1
    (vpc,) = vpcs
    assert re.fullmatch(r"vpc-[0-9a-f]{17}", str(vpc))
    assert resolve(aws_meta_data(seed()), f"network/interfaces/macs/{MAC0}/vpc-id") == vpc  # stable
    other = aws_meta_data({**seed(), "project_id": "other"})
    assert resolve(other, f"network/interfaces/macs/{MAC0}/vpc-id") not in {vpc, None}
    assert resolve(other, f"network/interfaces/macs/{MAC0}/interface-id") == resolve(
        tree, f"network/interfaces/macs/{MAC0}/interface-id"
    )  # the ENI follows the MAC
    assert resolve(other, f"network/interfaces/macs/{MAC0}/subnet-id") != resolve(
        tree, f"network/interfaces/macs/{MAC0}/subnet-id"
    )  # a subnet belongs to its VPC
    doc["network"]["vpc_id"] = "vpc-0123456789abcdef0"
    assert resolve(aws_meta_data(doc), f"network/interfaces/macs/{MAC1}/vpc-id") == "vpc-0123456789abcdef0"


def test_without_a_bond_the_first_interface_is_primary_and_holds_every_address_kind():
    """No bonding MAC: the first interface is primary; v4 private/public and v6 are split per family."""
    doc = seed()
    del doc["network"]["bonding"]
    doc["network"]["addresses"].append({"address_family": 4, "public": False, "address": "10.1.1.1"})
    tree = aws_meta_data(doc)
    assert resolve(tree, "mac") == MAC0
    assert resolve(tree, f"network/interfaces/macs/{MAC0}/local-ipv4s") == "10.70.17.9\n10.1.1.1"
    assert resolve(tree, f"network/interfaces/macs/{MAC0}/public-ipv4s") == "40.91.78.229"
    assert resolve(tree, f"network/interfaces/macs/{MAC0}/ipv6s") == "2001:0db8:8583:0000::9"
    assert resolve(tree, "local-ipv4") == "10.70.17.9"  # the first private v4 only


def test_without_interfaces_there_is_no_mac_or_network():
    """No usable interface: neither 'mac' nor 'network/' is listed."""
    doc = seed()
    doc["network"]["interfaces"] = [{"name": "eth0"}]
    tree = aws_meta_data(doc)
    assert resolve(tree, "mac") is None
    assert resolve(tree, "network") is None
    assert "mac" not in tree.listing().splitlines()


def test_addresses_absent_means_no_address_keys_in_the_aws_layout():
    """Without addresses there is no local-ipv4 or public-ipv4, and interfaces carry no address lists."""
    doc = seed()
    doc["network"]["addresses"] = []
    tree = aws_meta_data(doc)
    for key in ("local-ipv4", "public-ipv4"):
        assert resolve(tree, key) is None
    assert body(resolve(tree, f"network/interfaces/macs/{MAC0}")) == (  # type: ignore[arg-type]
        b"device-number\ninterface-id\nlocal-hostname\nmac\nvpc-id"
    )



@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({}, ("da1", "da11")),
        ({"region": "us-west-2", "availability_zone": "us-west-2a"}, ("us-west-2", "us-west-2a")),
        ({"region": "us-west-2"}, ("us-west-2", "da11")),
        ({"availability_zone": "us-west-2a"}, ("us-west-2", "us-west-2a")),
        ({"availability_zone": "z", "facility": None}, ("da", "z")),
    ],
)
def test_placement_prefers_explicit_region_and_zone_over_metro_and_facility(extra, expected):
    """An explicit region wins; else the zone minus its last letter, as botocore and cloud-init derive it.

    Facility da11 gives region da1 (not the metro da); the metro only when that is empty.
    """
    doc = {**seed(), **extra}
    assert placement(doc) == expected
    tree = aws_meta_data(doc)
    assert resolve(tree, "placement/region") == expected[0]
    assert resolve(tree, "placement/availability-zone") == expected[1]


def test_placement_is_absent_without_any_location():
    """No region, metro, zone or facility: no placement/ at all; with only one, only that leaf."""
    assert resolve(aws_meta_data(without(seed(), "metro", "facility")), "placement") is None
    only_zone = aws_meta_data({**without(seed(), "metro"), "facility": "z"})  # too short to derive a region from
    assert body(resolve(only_zone, "placement")) == b"availability-zone"  # type: ignore[arg-type]


def test_spot_termination_time_and_life_cycle():
    """A spot object makes the instance 'spot'; a termination time adds spot/termination-time."""
    with_time = aws_meta_data({**seed(), "spot": {"termination_time": "2022-07-07T13:13:13Z"}})
    assert resolve(with_time, "instance-life-cycle") == "spot"
    assert body(resolve(with_time, "spot")) == b"termination-time"  # type: ignore[arg-type]
    assert resolve(with_time, "spot/termination-time") == "2022-07-07T13:13:13Z"
    no_time = aws_meta_data({**seed(), "spot": {}})
    assert resolve(no_time, "instance-life-cycle") == "spot"
    assert resolve(no_time, "spot") is None
    assert resolve(aws_meta_data(seed()), "spot") is None


def test_ami_id_falls_back_to_the_slug_and_block_devices_need_a_disk():
    """ami-id is the image tag, else the slug; block-device-mapping needs storage.disks[0].device."""
    doc = seed()
    del doc["operating_system"]["image_tag"]
    del doc["storage"]
    tree = aws_meta_data(doc)
    assert resolve(tree, "ami-id") == "ubuntu_20_04"
    assert resolve(tree, "block-device-mapping") is None


# --- identity document and version roots -----------------------------------------------------------------------


def instance(doc: dict[str, Any] | None, userdata: bytes | None = None) -> Instance:
    return Instance(
        id=INSTANCE_ID,
        metadata=doc,
        metadata_updated_at=datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC),
        userdata=userdata,
    )


def test_identity_document_carries_the_records_fields():
    """AWS's identity fields come from the document: ids, placement, type, private IP, account, architecture."""
    document = json.loads(identity_document(instance({**seed(), "project_id": "proj-1"})))
    assert document == {
        "accountId": "proj-1",
        "architecture": "x86_64",
        "availabilityZone": "da11",
        "billingProducts": None,
        "devpayProductCodes": None,
        "marketplaceProductCodes": None,
        "imageId": "31853a2b0b2fcc4ee7fd5da5e53611303b60aafa",
        "instanceId": INSTANCE_ID,
        "instanceType": "c3.medium.x86",
        "kernelId": None,
        "pendingTime": "2024-05-06T07:08:09Z",
        "privateIp": "10.70.17.9",
        "ramdiskId": None,
        "region": "da1",
        "version": "2017-09-30",
    }


def test_identity_document_architecture_and_missing_private_ip():
    """An arm plan reports arm64; no private v4 address gives privateIp null."""
    doc = {**seed(), "plan": "c3.large.arm64", "region": "us-west-2", "availability_zone": "us-west-2a"}
    doc["network"]["addresses"] = []
    document = json.loads(identity_document(instance(doc)))
    assert document["architecture"] == "arm64"
    assert document["privateIp"] is None
    assert (document["region"], document["availabilityZone"]) == ("us-west-2", "us-west-2a")


@pytest.mark.parametrize("version", AWS_VERSIONS)
def test_aws_version_root_has_dynamic_meta_data_and_user_data(version):
    """Under each AWS version: dynamic/instance-identity (document + signatures), meta-data, user-data."""
    inst = instance(seed(), b"#!/bin/sh\n\xc3\xa9\n")
    signer = FakeSigner()
    root = version_root(inst, version, signer)
    document = identity_document(inst)
    assert root.listing() == "dynamic\nmeta-data\nuser-data"  # AWS lists the version root bare
    assert body(resolve(root, "dynamic")) == b"instance-identity/"  # type: ignore[arg-type]
    assert body(resolve(root, "dynamic/instance-identity")) == b"document\npkcs7\nrsa2048\nsignature"  # type: ignore[arg-type]
    assert resolve(root, "dynamic/instance-identity/document") == document
    assert signer.signed == []  # nothing signed until a signature is read
    pkcs7 = resolve(root, "dynamic/instance-identity/pkcs7")
    assert isinstance(pkcs7, Later)
    assert resolve(root, "dynamic/instance-identity/rsa2048") is pkcs7  # one PKCS#7 serves pkcs7 and rsa2048
    assert body(pkcs7) == f"p7({len(document)})".encode()
    assert body(resolve(root, "dynamic/instance-identity/rsa2048")) == f"p7({len(document)})".encode()  # type: ignore[arg-type]
    assert signer.signed == [("pkcs7", document)]  # made once, kept in the leaf
    assert body(resolve(root, "dynamic/instance-identity/signature")) == f"sig({len(document)})".encode()  # type: ignore[arg-type]
    assert signer.signed == [("pkcs7", document), ("signature", document)]
    assert text_tree(resolve(root, "meta-data")) == AWS_SEED  # type: ignore[arg-type]
    assert resolve(root, "user-data") == b"#!/bin/sh\n\xc3\xa9\n"


def test_hollow_version_root_has_only_meta_data_and_user_data():
    """2009-04-04 serves hollow's meta-data and the userdata bytes, nothing dynamic."""
    root = version_root(instance(seed(), b"ud"), HOLLOW_VERSION, FakeSigner())
    assert root.listing() == "meta-data\nuser-data"
    assert text_tree(resolve(root, "meta-data")) == HOLLOW_SEED  # type: ignore[arg-type]
    assert resolve(root, "user-data") == b"ud"


@pytest.mark.parametrize("version", VERSIONS)
def test_a_missing_part_is_simply_absent(version):
    """Userdata only: just user-data; metadata only: no user-data; neither: an empty root."""
    only_userdata = version_root(instance(None, b"x"), version, FakeSigner())
    assert only_userdata.listing() == "user-data"
    assert "user-data" not in version_root(instance(seed()), version, FakeSigner())
    assert version_root(instance(None), version, FakeSigner()).listing() == ""


def test_versions_listing_is_every_version_one_per_line():
    """GET / lists hollow's version, then the AWS versions, oldest first, ending with latest."""
    assert versions_listing() == "2009-04-04\n2016-09-02\n2018-09-24\n2021-03-23\nlatest"
