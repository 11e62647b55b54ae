"""Real cloud-init (Debian's, system interpreter) against a real ``imds serve`` and the drives its CLI builds.

One server (SQLite in a temporary data dir, a free loopback port) holds the seed document with device role tags,
vendor data and userdata at 127.0.0.7; every client connects *from* 127.0.0.7 and only to the server (a guard
refuses any other destination, 169.254.169.254 included). ``imds configdrive build`` reads the same database
and writes a config-2 drive and a NoCloud seed; the tests extract them with pycdlib for cloud-init's readers.
cloud-init runs once, in one subprocess, through every reader below; no boot stage runs.
"""

from __future__ import annotations

import base64
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cloudinit_guard import GUEST_GUARD, run_cloud_init
from iso_reader import extract, read_iso, volume_label
from openstack_data import SEED_ID, USERDATA, VENDOR_DATA, devices, openstack_document, seed_document
from serve_process import Server, clean_env, serving

IMDS = Path(sys.executable).parent / "imds"
GUEST = "127.0.0.7"
HOSTNAME = "metadata-example-01"
CLIENT_TIMEOUT = 90

CLOUD_INIT_SCRIPT = r"""
import base64, json, os, sys

cfg = json.loads(sys.argv[1])

""" + GUEST_GUARD + r"""

from cloudinit import distros, helpers, util
from cloudinit.sources import DataSourceConfigDrive, DataSourceNoCloud, DataSourceOpenStack
from cloudinit.sources.helpers import ec2, openstack

util._DNS_REDIRECT_IP = set()  # no DNS probes for "bad" names: the only URL is an IP address
# The EC2 half of an OpenStack crawl goes to 169.254.169.254, which *is* the metadata server in a real cloud:
# point it at the test server (the guard above refuses the real address anyway).
openstack.MetadataReader._read_ec2_metadata = lambda self: ec2.get_instance_metadata(
    metadata_address=self.base_path, timeout=self.timeout, retries=0)

url, tmp = cfg["url"], cfg["tmp"]


def b64(data):
    if data is None:
        return None
    return base64.b64encode(data if isinstance(data, bytes) else data.encode()).decode()


def source(name, ds_name, ds_cfg):
    root = os.path.join(tmp, name)
    paths = helpers.Paths({"cloud_dir": root + "/cloud", "run_dir": root + "/run", "docs_dir": root + "/docs",
                           "templates_dir": root + "/templates"})
    distro = distros.fetch("debian")("debian", {}, paths)
    sys_cfg = {"datasource_list": [ds_name], "datasource": {ds_name: ds_cfg}}
    return paths, distro, sys_cfg


def facts(ds):
    return {"instance_id": ds.get_instance_id(), "hostname": ds.get_hostname().hostname,
            "public_keys": ds.get_public_ssh_keys(), "userdata": b64(ds.userdata_raw)}


def summary(results):
    md = results["metadata"]
    return {"uuid": md.get("uuid"), "instance-id": md.get("instance-id"), "local-hostname": md.get("local-hostname"),
            "public_keys": md.get("public_keys"), "devices": md.get("devices"), "project_id": md.get("project_id"),
            "random_seed_bytes": len(md.get("random_seed", b"")), "userdata": b64(results.get("userdata")),
            "vendordata": results.get("vendordata"), "vendordata2": results.get("vendordata2"),
            "networkdata": results.get("networkdata"), "ec2_instance_id": results["ec2-metadata"].get("instance-id"),
            "version": results["version"]}


out = {}

# 1. The OpenStack metadata service, read by cloud-init's MetadataReader (what the datasource calls).
reader = openstack.MetadataReader(url, timeout=10, retries=0)
out["reader"] = summary(reader.read_v2())
out["reader"]["working_version"] = reader._find_working_version()

# 2. DataSourceOpenStack: waits for /openstack, crawls, converts network_data. No DMI here: say it is OpenStack.
DataSourceOpenStack.detect_openstack = lambda accept_oracle=False: True
paths, distro, sys_cfg = source("openstack", "OpenStack", {"metadata_urls": [url], "max_wait": 10, "timeout": 2,
                                                           "retries": 0})
ds = DataSourceOpenStack.DataSourceOpenStack(sys_cfg, distro, paths)
ok = ds._get_data()
out["openstack"] = {"ok": ok}
if ok:
    out["openstack"].update(facts(ds), devices=ds.metadata.get("devices"), network_json=ds.network_json,
                            vendordata=b64(ds.vendordata_raw),
                            network_config=openstack.convert_net_json(ds.network_json, known_macs=cfg["macs"]))

# 3. read_config_drive over the drive's extracted tree (as mounted), and DataSourceConfigDrive from its seed dir.
out["drive_tree"] = summary(DataSourceConfigDrive.read_config_drive(cfg["drive_tree"]))
paths, distro, sys_cfg = source("configdrive", "ConfigDrive", {})
os.makedirs(paths.seed_dir, exist_ok=True)
os.symlink(cfg["drive_tree"], os.path.join(paths.seed_dir, "config_drive"))
ds = DataSourceConfigDrive.DataSourceConfigDrive(sys_cfg, distro, paths)
ok = ds._get_data()
out["drive_seed_dir"] = {"ok": ok, **(facts(ds) if ok else {}), "source": ds.source,
                         "devices": ds.metadata.get("devices") if ok else None, "network_json": ds.network_json}

# 4. DataSourceConfigDrive from the ISO file as a device: blkid must find it by label config-2 and type iso9660;
#    it is mounted when this kernel has iso9660, else its extracted tree stands in for the mount point.
iso = cfg["drive_iso"]
found = {"label": util.find_devs_with("LABEL=config-2", path=iso, no_cache=True),
         "type": util.find_devs_with("TYPE=iso9660", path=iso, no_cache=True)}
DataSourceConfigDrive.find_candidate_devs = lambda probe_optical=True, dslist=None: sorted(
    set(found["label"]) & set(found["type"]))
kernel_iso9660 = "iso9660" in open("/proc/filesystems").read()
real_mount_cb = util.mount_cb
mounted = []
def mount_cb(device, callback, data=None, mtype=None, **kwargs):
    if kernel_iso9660:
        mounted.append(device)
        return real_mount_cb(device, callback, data=data, mtype=mtype, **kwargs)
    return callback(cfg["drive_tree"]) if data is None else callback(cfg["drive_tree"], data)
util.mount_cb = mount_cb
paths, distro, sys_cfg = source("configdrive-device", "ConfigDrive", {})
ds = DataSourceConfigDrive.DataSourceConfigDrive(sys_cfg, distro, paths)
ok = ds._get_data()
out["drive_device"] = {"ok": ok, **(facts(ds) if ok else {}), "source": ds.source, "blkid": found,
                       "mounted": mounted, "devices": ds.metadata.get("devices") if ok else None}
util.mount_cb = real_mount_cb

# 5. NoCloud-Net: read_seeded on the /nocloud/ URL, then the datasource with seedfrom (no device probing).
md, ud, vd = util.read_seeded(url + "/nocloud/", timeout=10, retries=0)
out["read_seeded"] = {"meta": md, "userdata": b64(ud), "vendordata": b64(vd)}
paths, distro, sys_cfg = source("nocloud-net", "NoCloud", {"seedfrom": url + "/nocloud/", "fs_label": None})
ds = DataSourceNoCloud.DataSourceNoCloudNet(sys_cfg, distro, paths)
ok = ds._get_data()
out["nocloud_net"] = {"ok": ok, **(facts(ds) if ok else {}), "vendordata": b64(ds.vendordata_raw)}

# 6. NoCloud from the cidata seed (extracted into the seed dir, as a mounted seed is read), with network-config.
paths, distro, sys_cfg = source("nocloud", "NoCloud", {"fs_label": None})
os.makedirs(paths.seed_dir, exist_ok=True)
os.symlink(cfg["seed_tree"], os.path.join(paths.seed_dir, "nocloud"))
ds = DataSourceNoCloud.DataSourceNoCloud(sys_cfg, distro, paths)
ok = ds._get_data()
out["nocloud_seed"] = {"ok": ok, **(facts(ds) if ok else {}), "network_config": ds.network_config,
                       "vendordata": b64(ds.vendordata_raw)}
print(json.dumps(out))
"""


def imds_configdrive(server: Server, data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``imds configdrive build --data-dir DATA_DIR ARGS``: the CLI on the server's own database."""
    return subprocess.run(
        [str(IMDS), "configdrive", "build", "--data-dir", str(data_dir), *args],
        env=clean_env(data_dir.parent), capture_output=True, text=True, timeout=60, check=False,
    )


@pytest.fixture(scope="module")
def crawled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Serve the seed instance, build both drives with the CLI, run every cloud-init reader once; yield the results."""
    tmp = tmp_path_factory.mktemp("openstack-clients")
    data_dir = tmp / "data"
    with serving(tmp, "--data-dir", str(data_dir)) as server:
        document = openstack_document()
        server.post("/device-metadata", {"id": SEED_ID, "ipAddresses": [GUEST], "metadata": document})
        server.post("/device-userdata", {"id": SEED_ID, "ipAddresses": [GUEST], "userdata": USERDATA,
                                         "userdata_encoding": "text"})
        built = {}
        for fmt in ("config-2", "nocloud"):
            iso = tmp / f"{fmt}.iso"
            ran = imds_configdrive(server, data_dir, "--instance", SEED_ID, "-o", str(iso), "--format", fmt)
            assert ran.returncode == 0, ran.stderr
            assert ran.stdout.startswith(f"wrote {iso} ({fmt}, label ")
            built[fmt] = iso.read_bytes()
        cfg = {
            "url": server.url, "source": GUEST, "tmp": str(tmp / "cloud-init"),
            "drive_iso": str(tmp / "config-2.iso"),
            "drive_tree": str(extract(built["config-2"], tmp / "config-2")),
            "seed_tree": str(extract(built["nocloud"], tmp / "cidata")),
            "macs": {"40:a6:b7:74:9f:10": "enp1s0f0", "40:a6:b7:74:9f:11": "enp1s0f1"},
        }
        seen = run_cloud_init(CLOUD_INIT_SCRIPT, cfg, tmp, CLIENT_TIMEOUT)
        seen["_built"] = built
        seen["_server"] = server
        seen["_data_dir"] = data_dir
        yield seen


def userdata(value: str | None) -> bytes | None:
    return None if value is None else base64.b64decode(value)


def assert_openstack_results(results: dict[str, Any]) -> None:
    """What read_v2 returns from the service or a drive: ids, hostname, keys, devices, userdata, network, vendor."""
    keys = seed_document()["ssh_keys"]
    assert results["uuid"] == results["instance-id"] == SEED_ID
    assert results["local-hostname"] == HOSTNAME
    assert results["public_keys"] == {"test@testmachine.local": keys[0], "test@testmachine.local-1": keys[1]}
    assert results["devices"] == devices("example")
    assert results["random_seed_bytes"] == 512
    assert userdata(results["userdata"]) == USERDATA.encode()
    assert results["vendordata"] == VENDOR_DATA
    assert results["vendordata2"] == {"static": VENDOR_DATA}
    assert [link["id"] for link in results["networkdata"]["links"]] == ["eth0", "eth1", "bond0"]
    assert [n["ip_address"] for n in results["networkdata"]["networks"]] == [
        "40.91.78.229", "2001:0db8:8583:0000::9", "10.70.17.9"]
    assert results["ec2_instance_id"] == SEED_ID
    assert results["version"] == 2


def test_metadata_reader_reads_the_service(crawled):
    """MetadataReader picks 2018-08-27 (the newest it knows) and reads every part, EC2 half included."""
    assert crawled["reader"]["working_version"] == "2018-08-27"
    assert_openstack_results(crawled["reader"])


def test_openstack_datasource_crawls_and_converts_the_network(crawled):
    """DataSourceOpenStack: instance id, hostname, keys, exact userdata, devices, network_data → a bonded config."""
    got = crawled["openstack"]
    assert got["ok"] is True
    assert (got["instance_id"], got["hostname"]) == (SEED_ID, HOSTNAME)
    assert sorted(got["public_keys"]) == sorted(seed_document()["ssh_keys"])
    assert userdata(got["userdata"]) == USERDATA.encode()
    assert got["devices"] == devices("example")
    assert [link["type"] for link in got["network_json"]["links"]] == ["phy", "phy", "bond"]
    assert userdata(got["vendordata"]) == VENDOR_DATA["cloud-init"].encode()
    config = {entry["name"]: entry for entry in got["network_config"]["config"] if "name" in entry}
    assert config["bond0"]["bond_interfaces"] == ["eth0", "eth1"]
    assert config["bond0"]["params"]["bond_mode"] == "802.3ad"
    assert [(s["type"], s["address"]) for s in config["bond0"]["subnets"]] == [
        ("static", "40.91.78.229"), ("static6", "2001:0db8:8583:0000::9"), ("static", "10.70.17.9")]
    assert config["bond0"]["subnets"][0]["routes"] == [
        {"network": "0.0.0.0", "netmask": "0.0.0.0", "gateway": "40.91.78.228"},  # noqa: S104 - a route
        {"network": "169.254.169.254", "netmask": "255.255.255.255", "gateway": "40.91.78.228"}]  # metadata


def test_read_config_drive_reads_the_extracted_drive(crawled):
    """read_config_drive over the ISO's files (as a mount shows them) returns what the service returns."""
    assert_openstack_results(crawled["drive_tree"])


def test_config_drive_datasource_from_its_seed_dir_and_as_a_device(crawled):
    """DataSourceConfigDrive claims the drive from its seed dir, and as an ISO that blkid finds by label config-2."""
    iso = str(crawled["_data_dir"].parent / "config-2.iso")
    for name in ("drive_seed_dir", "drive_device"):
        got = crawled[name]
        assert got["ok"] is True, name
        assert (got["instance_id"], got["hostname"]) == (SEED_ID, HOSTNAME)
        assert sorted(got["public_keys"]) == sorted(seed_document()["ssh_keys"])
        assert userdata(got["userdata"]) == USERDATA.encode()
        assert got["devices"] == devices("example")
    assert crawled["drive_device"]["blkid"] == {"label": [iso], "type": [iso]}
    assert crawled["drive_device"]["source"] == iso
    assert crawled["drive_seed_dir"]["network_json"]["links"][2]["bond_links"] == ["eth0", "eth1"]


def test_nocloud_net_reads_the_seedfrom_url(crawled):
    """read_seeded and DataSourceNoCloudNet (seedfrom /nocloud/): instance id, hostname, keys, userdata, vendor data."""
    seeded = crawled["read_seeded"]
    assert seeded["meta"] == {"instance-id": SEED_ID, "local-hostname": HOSTNAME,
                              "public-keys": seed_document()["ssh_keys"]}
    assert userdata(seeded["userdata"]) == USERDATA.encode()
    assert userdata(seeded["vendordata"]) == VENDOR_DATA["cloud-init"].encode()
    got = crawled["nocloud_net"]
    assert got["ok"] is True
    assert (got["instance_id"], got["hostname"]) == (SEED_ID, HOSTNAME)
    assert sorted(got["public_keys"]) == sorted(seed_document()["ssh_keys"])
    assert userdata(got["userdata"]) == USERDATA.encode()


def test_nocloud_reads_the_cidata_seed_with_its_network_config(crawled):
    """DataSourceNoCloud over the cidata seed: the same facts, and network-config v2 with the bond and its routes."""
    got = crawled["nocloud_seed"]
    assert got["ok"] is True
    assert (got["instance_id"], got["hostname"]) == (SEED_ID, HOSTNAME)
    assert sorted(got["public_keys"]) == sorted(seed_document()["ssh_keys"])
    assert userdata(got["userdata"]) == USERDATA.encode()
    network = got["network_config"]
    assert network["version"] == 2
    assert network["bonds"]["bond0"]["interfaces"] == ["eth0", "eth1"]
    assert {"to": "10.0.0.0/8", "via": "10.70.17.8"} in network["bonds"]["bond0"]["routes"]


def test_the_cli_builds_drives_with_the_right_labels(crawled):
    """The CLI's images carry labels config-2 / cidata and the same files as the admin endpoint's image."""
    built = crawled["_built"]
    assert (volume_label(built["config-2"]), volume_label(built["nocloud"])) == ("config-2", "cidata")
    server = crawled["_server"]
    import httpx  # noqa: PLC0415 - only this test reads the admin endpoint

    with httpx.Client(timeout=10.0) as admin:
        served = admin.get(f"{server.url}/device-configdrive/{SEED_ID}", headers=server.admin_headers)
    assert served.status_code == 200
    from_cli, from_api = read_iso(built["config-2"]), read_iso(served.content)
    assert set(from_cli) == set(from_api)
    assert all(from_cli[p] == from_api[p] for p in from_cli if not p.endswith("meta_data.json"))


def test_the_cli_reports_unknown_instances_and_bad_ids(crawled, tmp_path):
    """An unknown id fails with one line (exit 1) and writes nothing; a malformed id is a usage error (exit 2)."""
    server, data_dir = crawled["_server"], crawled["_data_dir"]
    out = tmp_path / "x.iso"
    unknown = imds_configdrive(server, data_dir, "--instance", "00000000-0000-4000-8000-000000000000", "-o", str(out))
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == "Error: no metadata stored for instance 00000000-0000-4000-8000-000000000000"
    assert not out.exists()
    malformed = imds_configdrive(server, data_dir, "--instance", "web-1", "-o", str(out))
    assert malformed.returncode == 2
    assert "--instance must be a UUID" in malformed.stderr
    assert list(tmp_path.iterdir()) == []
