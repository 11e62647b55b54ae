"""``imds agent`` options: flags, IMDS_AGENT_* variables, defaults, validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from imds.agent.ovsdb import parse_snapshot
from imds.config import AGENT_OPTIONS, load_agent
from imds.errors import ConfigError

REQUIRED = {"IMDS_AGENT_UPSTREAM": "http://127.0.0.1:8000", "IMDS_AGENT_SHARED_SECRET_FILE": "/etc/imds/secret"}


def test_defaults_are_the_operator_contract():
    """br-int, br-meta, 240.0.0.0/16, fa:16:ee:00:00:00, VLAN 998, haproxy mode."""
    settings = load_agent({}, REQUIRED)
    assert (settings.integration_bridge, settings.metadata_bridge) == ("br-int", "br-meta")
    assert (settings.provider_cidr, settings.provider_base_mac, settings.provider_vlan_id) == (
        "240.0.0.0/16", "fa:16:ee:00:00:00", 998)
    assert settings.mode == "haproxy"
    assert settings.shared_secret_file == Path("/etc/imds/secret")


def test_every_flag_has_an_imds_agent_variable_and_flags_win():
    """Each option reads IMDS_AGENT_<NAME>; a flag given on the command line overrides it."""
    assert all(o.env == "IMDS_AGENT_" + o.name.upper() for o in AGENT_OPTIONS)
    env = {**REQUIRED, "IMDS_AGENT_PROVIDER_VLAN_ID": "42", "IMDS_AGENT_MODE": "inport"}
    settings = load_agent({"mode": "haproxy"}, env)
    assert settings.provider_vlan_id == 42
    assert settings.mode == "haproxy"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"IMDS_AGENT_UPSTREAM": ""}, "--upstream"),
        ({"IMDS_AGENT_MODE": "bridge"}, "--mode"),
        ({"IMDS_AGENT_PROVIDER_VLAN_ID": "4095"}, "--provider-vlan-id"),
        ({"IMDS_AGENT_META_PORT": "a-name-longer-than-15"}, "--meta-port"),
    ],
)
def test_invalid_settings_name_their_flag(change, message):
    """Missing or invalid values are ConfigErrors naming the flag."""
    env = {**REQUIRED, **change}
    if change.get("IMDS_AGENT_UPSTREAM") == "":
        del env["IMDS_AGENT_UPSTREAM"]
    with pytest.raises(ConfigError, match=message):
        load_agent({}, env)


def test_snapshot_finds_vm_ports_with_tag_tenant_and_stored_addresses():
    """An Interface with vm-uuid and attached-mac on the bridge is a VM port; its Port tag is its VLAN."""
    reply = [
        {"rows": [{"name": "br-int", "datapath_type": "netdev",
                   "ports": ["set", [["uuid", "p1"], ["uuid", "p2"], ["uuid", "p3"]]]}]},
        {"rows": [{"_uuid": ["uuid", "p1"], "interfaces": ["uuid", "i1"], "tag": 5},
                  {"_uuid": ["uuid", "p2"], "interfaces": ["uuid", "i2"], "tag": ["set", []]},
                  {"_uuid": ["uuid", "p3"], "interfaces": ["uuid", "i3"], "tag": ["set", []]}]},
        {"rows": [
            {"_uuid": ["uuid", "i1"], "name": "tap1", "ofport": 3, "type": "",
             "external_ids": ["map", [["vm-uuid", "u1"], ["attached-mac", "FA:16:3E:00:00:01"],
                                      ["tenant-id", "t1"]]],
             "other_config": ["map", [["provider_ip", "240.0.0.7"]]]},
            {"_uuid": ["uuid", "i2"], "name": "tap2", "ofport": 4, "type": "",
             "external_ids": ["map", [["vm-uuid", "u2"], ["attached-mac", "fa:16:3e:00:00:02"]]],
             "other_config": ["map", []]},
            {"_uuid": ["uuid", "i3"], "name": "patch", "ofport": 1, "type": "patch",
             "external_ids": ["map", []], "other_config": ["map", []]},
        ]},
    ]
    snap = parse_snapshot(reply)
    assert snap.bridges["br-int"][0] == "netdev"
    first, second = snap.vm_ports("br-int")
    assert (first.name, first.ofport, first.vm_uuid, first.mac, first.tag, first.tenant) == (
        "tap1", 3, "u1", "fa:16:3e:00:00:01", 5, "t1")
    assert first.other_config["provider_ip"] == "240.0.0.7"
    assert (second.tag, second.tenant) == (0, None)
    assert snap.vm_ports("br-other") == []


def test_docs_list_every_agent_option():
    """docs/hypervisor.md's ``imds agent`` table is exactly options_table(AGENT_OPTIONS)."""
    from imds.config import options_table  # noqa: PLC0415 - kept beside the one test that needs it

    text = (Path(__file__).parents[3] / "docs" / "hypervisor.md").read_text().split("## `imds agent`", 1)[1]
    start = text.index("| flag | environment |")
    assert text[start : text.index("\n\n", start)] == options_table(AGENT_OPTIONS)
