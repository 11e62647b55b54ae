"""Real clients under ``--instance-auth``: what the policy matrix in the README says about them.

cloud-init's OpenStack and NoCloud-Net readers send no ``Metadata``/``Metadata-Flavor``
header and no token, so a protected flavor refuses them (why the policy is opt-in), while
the same reader works against the flavor left open. EC2 clients under ``--instance-auth
all`` are covered by ``test_ec2_clients.py`` (its required-mode server runs with it).
"""

from __future__ import annotations

import pytest

from cloudinit_guard import GUEST_GUARD, run_cloud_init
from serve_process import serving

GUEST = "127.0.0.23"
INSTANCE = "6c1d5b49-7b4f-4d5f-8a62-3f1b8b000002"
USERDATA = "#cloud-config\nruncmd: [echo policy]\n"

SCRIPT = r"""
import json, sys
cfg = json.loads(sys.argv[1])
""" + GUEST_GUARD + r"""
from cloudinit import util
from cloudinit.sources.helpers import openstack
util._DNS_REDIRECT_IP = set()
out = {}
try:
    reader = openstack.MetadataReader(cfg["url"], timeout=5, retries=0)
    out["openstack"] = reader.read_v2()["metadata"]["uuid"]
except Exception as exc:
    out["openstack"] = "refused: " + type(exc).__name__
try:
    md, ud, vd = util.read_seeded(cfg["url"] + "/nocloud/", timeout=5, retries=0)
    out["nocloud"] = md["instance-id"]
except Exception as exc:
    out["nocloud"] = "refused: " + type(exc).__name__
print(json.dumps(out))
"""


@pytest.mark.parametrize(("protected", "expected"), [
    ("openstack", {"openstack": "refused", "nocloud": INSTANCE}),
    ("nocloud", {"openstack": INSTANCE, "nocloud": "refused"}),
])
def test_cloud_init_readers_are_refused_by_a_protected_flavor_only(tmp_path, protected, expected):
    """A flavor under --instance-auth refuses cloud-init's header-less reader; the other flavor still serves it."""
    with serving(tmp_path, "--data-dir", str(tmp_path / "data"), "--instance-auth", protected) as server:
        document = {"id": INSTANCE, "hostname": "policy-1"}
        server.post("/device-metadata", {"id": INSTANCE, "ipAddresses": [GUEST], "metadata": document})
        server.post("/device-userdata", {"id": INSTANCE, "ipAddresses": [GUEST], "userdata": USERDATA,
                                         "userdata_encoding": "text"})
        got = run_cloud_init(SCRIPT, {"url": server.url, "source": GUEST}, tmp_path, 60)
    for flavor, want in expected.items():
        if want == "refused":
            assert got[flavor].startswith("refused: "), got
        else:
            assert got[flavor] == want, got
