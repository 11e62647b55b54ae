"""The OpenStack renderer: versions, what each version lists, meta_data.json fields and gating, the seed splice."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from helpers import fixture_json
from imds.models import Instance
from imds.services.render.openstack import (
    DATED_VERSIONS,
    VERSIONS,
    SeededJson,
    devices,
    key_names,
    meta_data,
    meta_data_document,
    since,
    version_dir,
    versions_listing,
)
from imds.services.render.tree import Dir

SEED = fixture_json("metadata-example.json")
SEED_ID = SEED["id"]
NIC = {"type": "nic", "bus": "pci", "address": "0000:00:02.0", "mac": "01:22:22:42:22:21", "tags": ["a"],
       "vlan": 42, "vf_trusted": True}
DISK = {"type": "disk", "bus": "scsi", "address": "1:0:2:0", "serial": "vol-1", "tags": ["db"]}


def instance(doc: dict[str, Any] | None = None, **extra: Any) -> Instance:
    return Instance(id=SEED_ID, metadata=SEED if doc is None else doc, **extra)


def listing(version: str, inst: Instance) -> list[str]:
    return version_dir(inst, version).listing().split("\n")


def test_versions_are_novas_in_order_with_latest_last():
    """/openstack lists Nova's ten dated versions oldest first, then latest, without slashes."""
    assert versions_listing() == (
        "2012-08-10\n2013-04-04\n2013-10-17\n2015-10-15\n2016-06-30\n2016-10-06\n2017-02-22\n2018-08-27\n"
        "2020-10-14\n2025-04-04\nlatest"
    )
    assert VERSIONS[-1] == "latest"
    assert list(DATED_VERSIONS) == sorted(DATED_VERSIONS)


def test_since_treats_latest_as_the_newest_version():
    """since() orders versions; latest has everything."""
    assert since("2013-04-04", "2013-04-04")
    assert not since("2012-08-10", "2013-04-04")
    assert since("latest", "2025-04-04")
    assert not since("2016-06-30", "2017-02-22")


@pytest.mark.parametrize(
    ("version", "files"),
    [
        ("2012-08-10", ["meta_data.json", "user_data"]),
        ("2013-04-04", ["meta_data.json", "user_data", "password"]),
        ("2013-10-17", ["meta_data.json", "user_data", "password", "vendor_data.json"]),
        ("2015-10-15", ["meta_data.json", "user_data", "password", "vendor_data.json", "network_data.json"]),
        ("2016-10-06", ["meta_data.json", "user_data", "password", "vendor_data.json", "network_data.json",
                        "vendor_data2.json"]),
        ("latest", ["meta_data.json", "user_data", "password", "vendor_data.json", "network_data.json",
                    "vendor_data2.json"]),
    ],
)
def test_each_version_lists_what_nova_lists(version, files):
    """The version listing grows as Nova's does: password from 2013-04-04, vendor/network data later."""
    assert listing(version, instance(userdata=b"#!")) == files


def test_user_data_is_listed_only_when_there_is_some():
    """Without userdata there is no user_data entry (Nova 404s it)."""
    assert "user_data" not in listing("latest", instance())
    assert version_dir(instance(userdata=b"\x00\xff"), "latest")["user_data"] == b"\x00\xff"


@pytest.mark.parametrize(
    ("version", "added"),
    [
        ("2012-08-10", set()),
        ("2015-10-15", {"project_id"}),
        ("2016-06-30", {"project_id", "devices"}),
        ("2020-10-14", {"project_id", "devices", "dedicated_cpus"}),
        ("latest", {"project_id", "devices", "dedicated_cpus"}),
    ],
)
def test_meta_data_fields_appear_from_their_version(version, added):
    """uuid, hostname, name, launch_index, availability_zone and keys always; newer fields only from their version."""
    base = {"uuid", "public_keys", "keys", "hostname", "name", "launch_index", "availability_zone"}
    assert set(meta_data_document(instance(), version)) == base | added


def test_meta_data_maps_the_equinix_document():
    """Seed document → uuid, hostname/name, facility as zone, keys named by comment, Nova's keys list."""
    md = meta_data_document(instance(), "latest")
    keys = SEED["ssh_keys"]
    assert md["uuid"] == SEED_ID
    assert (md["hostname"], md["name"], md["launch_index"]) == ("metadata-example-01", "metadata-example-01", 0)
    assert md["availability_zone"] == "da11"
    assert md["public_keys"] == {"test@testmachine.local": keys[0], "test@testmachine.local-1": keys[1]}
    assert md["keys"] == [
        {"name": "test@testmachine.local", "type": "ssh", "data": keys[0]},
        {"name": "test@testmachine.local-1", "type": "ssh", "data": keys[1]},
    ]
    assert (md["project_id"], md["devices"], md["dedicated_cpus"]) == ("", [], [])
    assert "meta" not in md


def test_explicit_fields_win_and_meta_merges_tags():
    """name, availability_zone, project_id, launch_index come from the document; meta = k=v tags + meta object."""
    doc = {"hostname": "h", "name": "web one", "availability_zone": "az-1", "facility": "da11", "project_id": "p-1",
           "launch_index": 3, "tags": ["role=web", "bare", "env=dev"], "meta": {"env": "prod", "dsmode": "net"},
           "dedicated_cpus": [2, 3, "x"]}
    md = meta_data_document(instance(doc), "latest")
    assert (md["name"], md["availability_zone"], md["project_id"], md["launch_index"]) == ("web one", "az-1", "p-1", 3)
    assert md["meta"] == {"role": "web", "env": "prod", "dsmode": "net"}
    assert md["dedicated_cpus"] == [2, 3]
    assert "public_keys" not in md
    assert "keys" not in md


def test_a_document_without_openstack_parts_is_still_valid():
    """An Equinix-only document with nothing but an id renders a complete meta_data.json."""
    md = meta_data_document(instance({}), "latest")
    assert md == {"uuid": SEED_ID, "hostname": "", "name": "", "launch_index": 0, "availability_zone": "",
                  "project_id": "", "devices": [], "dedicated_cpus": []}


def test_device_fields_appear_from_their_version():
    """Devices show vlan from 2017-02-22 and vf_trusted from 2018-08-27; everything else passes through as given."""
    doc = {"devices": [NIC, DISK]}
    bare_nic = {k: v for k, v in NIC.items() if k not in ("vlan", "vf_trusted")}
    assert devices(doc, "2016-06-30") == [bare_nic, DISK]
    assert devices(doc, "2017-02-22") == [{**bare_nic, "vlan": 42}, DISK]
    assert devices(doc, "2018-08-27") == [NIC, DISK]
    assert devices(doc, "latest") == [NIC, DISK]
    assert "devices" not in meta_data_document(instance(doc), "2015-10-15")


def test_key_names_are_unique():
    """Keys without a comment are key-N; a repeated comment gets -N."""
    assert key_names(["ssh-rsa AAA me", "ssh-rsa BBB", "ssh-rsa CCC me"]) == ["me", "key-1", "me-2"]


def test_meta_data_is_seeded_from_2013_04_04():
    """meta_data.json is SeededJson from 2013-04-04: with_seed adds base64(seed) as random_seed; 2012-08-10 has none."""
    assert not isinstance(meta_data(instance(), "2012-08-10"), SeededJson)
    seeded = meta_data(instance(), "2013-04-04")
    assert isinstance(seeded, SeededJson)
    assert "random_seed" not in json.loads(seeded)
    document = json.loads(seeded.with_seed(b"\x01" * 512))
    assert base64.b64decode(document["random_seed"]) == b"\x01" * 512
    assert {k: v for k, v in document.items() if k != "random_seed"} == json.loads(seeded)


def test_vendor_and_network_data():
    """vendor_data.json is vendor_data ({} without), vendor_data2.json wraps it as static; network_data as given."""
    network = {"links": [{"id": "l", "type": "phy"}], "networks": [], "services": []}
    tree = version_dir(instance({"vendor_data": {"cloud-init": "#cloud-config\n"}, "network_data": network}), "latest")
    assert json.loads(tree["vendor_data.json"]) == {"cloud-init": "#cloud-config\n"}
    assert json.loads(tree["vendor_data2.json"]) == {"static": {"cloud-init": "#cloud-config\n"}}
    assert json.loads(tree["network_data.json"]) == network
    empty = version_dir(instance({}), "latest")
    assert (json.loads(empty["vendor_data.json"]), json.loads(empty["vendor_data2.json"])) == ({}, {"static": {}})
    assert json.loads(empty["network_data.json"]) == {"links": [], "networks": [], "services": []}


def test_password_is_the_stored_bytes_or_empty():
    """The password file answers the stored password, or nothing before one is posted."""
    assert version_dir(instance(), "latest")["password"] == b""
    assert version_dir(instance(password=b"c2VjcmV0"), "2013-04-04")["password"] == b"c2VjcmV0"
    assert isinstance(version_dir(instance(), "latest"), Dir)
