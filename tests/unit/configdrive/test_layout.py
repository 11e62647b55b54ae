"""Drive layouts (config-2 and NoCloud) from the renderers, and the ISO 9660 + Joliet + Rock Ridge images."""

from __future__ import annotations

import json

import pytest

from helpers import fixture_json
from imds.configdrive.iso import _mangle, iso_bytes
from imds.errors import RecordNotFound
from imds.models import Instance
from imds.services import drives
from imds.services.render.drive import config_drive, layout, nested, nocloud_seed
from imds.services.render.ec2 import aws_meta_data, hollow_meta_data
from imds.services.render.openstack import VERSIONS, version_dir
from imds.services.render.tree import Dir
from iso_reader import read_iso, volume_label

SEED = fixture_json("metadata-example.json")
DEVICES = fixture_json("device-role-tagging-example.json")["devices"]
USERDATA = b"#cloud-config\nhostname: x\n"


def seeded(**extra) -> Instance:
    return Instance(id=SEED["id"], metadata={**SEED, "devices": DEVICES}, userdata=USERDATA, **extra)


def test_config_drive_holds_every_version_and_the_ec2_trees():
    """openstack/<v>/<file> for every version (no password); ec2/{2009-04-04,latest}/{meta-data.json,user-data}."""
    files = config_drive(seeded(password=b"pw"))
    expected = {
        f"openstack/{version}/{name}"
        for version in VERSIONS
        for name in version_dir(seeded(), version)
        if name != "password"
    } | {f"ec2/{v}/{name}" for v in ("2009-04-04", "latest") for name in ("meta-data.json", "user-data")}
    assert set(files) == expected
    assert len([p for p in files if p.startswith("openstack/")]) == 2 + 2 + 3 + 4 + 4 + 6 * 5
    assert not any(p.endswith("/password") for p in files)
    assert files["openstack/latest/user_data"] == USERDATA
    assert files["ec2/latest/user-data"] == USERDATA


def test_each_meta_data_json_gets_its_own_seed():
    """Every meta_data.json from 2013-04-04 on carries a random_seed (512 bytes); 2012-08-10 has none."""
    seeds = iter(bytes([n]) * 512 for n in range(1, 100))
    files = config_drive(seeded(), seed=lambda: next(seeds))
    documents = {v: json.loads(files[f"openstack/{v}/meta_data.json"]) for v in VERSIONS}
    assert "random_seed" not in documents["2012-08-10"]
    assert len({d["random_seed"] for v, d in documents.items() if v != "2012-08-10"}) == len(VERSIONS) - 1
    assert documents["latest"]["devices"] == DEVICES


def test_ec2_meta_data_json_is_the_tree_as_nested_json():
    """ec2/latest/meta-data.json is the AWS tree as nested objects (public-keys/0/openssh-key), 2009-04-04 hollow's."""
    files = config_drive(seeded())
    latest = json.loads(files["ec2/latest/meta-data.json"])
    assert latest == nested(aws_meta_data(SEED))
    assert latest["public-keys"]["0"] == {"openssh-key": SEED["ssh_keys"][0]}
    assert latest["placement"] == {"availability-zone": "da11", "region": "da1"}  # the region clients derive
    assert json.loads(files["ec2/2009-04-04/meta-data.json"]) == nested(hollow_meta_data(SEED))
    assert nested(Dir([("a", b"\xff")])) == {"a": "\ufffd"}


def test_a_drive_needs_metadata_and_userdata_is_optional():
    """No metadata → RecordNotFound; no userdata → no user_data / user-data files."""
    with pytest.raises(RecordNotFound):
        config_drive(Instance(id=SEED["id"], userdata=b"x"))
    files = config_drive(Instance(id=SEED["id"], metadata=SEED))
    assert not any(p.endswith(("user_data", "user-data")) for p in files)


def test_nocloud_seed_files():
    """The cidata seed holds meta-data, user-data, vendor-data and network-config at its root."""
    files = nocloud_seed(seeded())
    assert list(files) == ["meta-data", "user-data", "vendor-data", "network-config"]
    assert files["user-data"] == USERDATA


@pytest.mark.parametrize(("fmt", "label"), [("config-2", "config-2"), ("nocloud", "cidata")])
def test_images_read_back_identically_through_rock_ridge_and_joliet(fmt, label):
    """The image's label is config-2 / cidata, and its Rock Ridge and Joliet trees both hold exactly the layout."""
    files = layout(seeded(), fmt)
    data = drives.image(seeded(), fmt)
    assert volume_label(data) == label
    for names in ("rr", "joliet"):
        back = read_iso(data, names=names)
        assert set(back) == set(files)
        for path, content in files.items():
            if path.endswith("meta_data.json"):  # a fresh seed per build
                assert json.loads(back[path]).keys() == json.loads(content).keys()
            else:
                assert back[path] == content, path


def test_iso9660_names_are_mangled_uniquely():
    """Level-3 names: upper case, '_' for other characters, truncated, and unique within a directory."""
    taken: set[str] = set()
    assert _mangle("meta_data.json", directory=False, taken=taken) == "META_DATA.JSON"
    assert _mangle("meta-data.json", directory=False, taken=taken) == "META_DATA_1.JSON"
    assert _mangle("2012-08-10", directory=True, taken=taken) == "2012_08_10"
    assert _mangle("user_data", directory=False, taken=taken) == "USER_DATA"
    long = _mangle("x" * 40 + ".json", directory=False, taken=taken)
    assert (long, len(long)) == ("X" * 25 + ".JSON", 30)
    data = iso_bytes({"a/b-c": b"1", "a/b_c": b"2", "a/B.C": b"3"}, "test")
    assert read_iso(data) == {"a/b-c": b"1", "a/b_c": b"2", "a/B.C": b"3"}
