"""What Debian's cloud-init (22.4, system interpreter) writes for the networks imds derives: the way to metadata stays.

Each derived ``network_data.json`` goes through cloud-init's own OpenStack converter and its
ifupdown (ENI) renderer, as a Debian guest's init-local stage does; NoCloud's ``network-config``
goes through its v2 parser and the same renderer. No boot stage runs, nothing touches the host's
network: the renderer writes into a temporary directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cloudinit_guard import run_cloud_init
from imds.services.render.network import network_config_v2, network_data

MAC = "52:54:00:12:34:56"

SCRIPT = r"""
import json, sys
cfg = json.loads(sys.argv[1])
from cloudinit.net import eni
from cloudinit.net.network_state import parse_net_config_data
from cloudinit.sources.helpers import openstack

def render(config):
    state = parse_net_config_data(config)
    return eni.Renderer({"eni_path": "etc/network/interfaces", "netrules_path": None})._render_interfaces(state)

out = {}
for name, data in cfg["network_data"].items():
    out[name] = render(openstack.convert_net_json(data, known_macs={cfg["mac"]: "ens2"}))
for name, v2 in cfg["v2"].items():
    out["v2-" + name] = render(v2)
print(json.dumps(out))
"""


def record(**address: Any) -> dict[str, Any]:
    return {"network": {"interfaces": [{"name": "ens2", "mac": MAC}],
                        "addresses": [{"address": "10.231.0.10", "cidr": 24, "public": False, **address}]}}


def test_cloud_init_renders_the_metadata_route_of_each_way(tmp_path: Path) -> None:
    """Via the DHCP port or the gateway: a route(8) line for 169.254.169.254; DHCP: ``inet dhcp`` and no route."""
    docs = {"port": record(metadata_route="10.231.0.1"), "gateway": record(gateway="10.231.0.254"),
            "dhcp": record(dhcp=True), "onlink": record()}
    cfg = {"mac": MAC, "network_data": {name: network_data(doc) for name, doc in docs.items()},
           "v2": {"port": network_config_v2(network_data(docs["port"]))}}
    eni = run_cloud_init(SCRIPT, cfg, tmp_path, timeout=120)

    assert "iface ens2 inet static" in eni["port"]
    assert "post-up route add -host 169.254.169.254/32 gw 10.231.0.1 || true" in eni["port"]
    assert "post-up route add -host 169.254.169.254/32 gw 10.231.0.254 || true" in eni["gateway"]
    assert "post-up route add -host 169.254.169.254/32 gw 10.231.0.1 || true" in eni["v2-port"]
    assert "iface ens2 inet dhcp" in eni["dhcp"]
    assert "169.254.169.254" not in eni["dhcp"]  # the lease gives the route again
    # On-link is written as option 121 and Neutron write it (next hop 0.0.0.0); cloud-init 22.4's ENI renderer
    # turns it into a route(8) line the kernel refuses (no device): docs/flavors.md says to name a hop for such guests.
    assert "post-up route add -host 169.254.169.254/32 gw 0.0.0.0 || true" in eni["onlink"]
