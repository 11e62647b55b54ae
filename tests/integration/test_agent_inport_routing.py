"""In-port mode without ``--meta-netns`` leaves the host's own routing alone.

The VMs' requests arrive on tap-meta from ``128.0.0.0 | ofport``; the proxy's answers must go
back out of tap-meta, yet ``128.0.0.0/16`` is an ordinary unicast block the host itself may
need to reach. So the agent routes it in a table of its own, consulted only for traffic from
tap-meta's address (the proxy's answers) or bound to the device, and removes both rules and
the table when it stops.

The "host" is a network namespace this test makes (the switch, the agent and the proxy run
in it; the machine's own routing is never touched), with an uplink to a router namespace
that holds ``128.0.0.9``: the host reaching that address must go through its own default
route, while a VM behind the switch reads its metadata through ``imds proxy --inport``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import wait_for
from ovs_harness import READY_TIMEOUT, AgentProcess, Ovs, Vm, netns_exec, ovs_daemons, peer_echo, sh, stop_process, vms

SECRET = b"inport-routing-secret"
INSTANCE = "e9000000-0000-4000-8000-0000000000e9"
TABLE = 4254  # the agent's default --inport-route-table
OUTSIDE = "128.0.0.9"  # in the router namespace: an ordinary address the host reaches through its uplink
UPSTREAM_PORT = 8775


@dataclass
class Host:
    ovs: Ovs
    netns: str
    router: str
    agent: AgentProcess
    vm: Vm


def _uplink(host: str, router: str, tag: str) -> None:
    """The host's uplink: a veth to the router namespace, the host's default route through it."""
    sh("ip", "netns", "add", router)
    up = f"up{tag}"
    sh("ip", "-n", host, "link", "add", up, "type", "veth", "peer", "name", "eth0", "netns", router)
    for ns, device, address in ((host, up, "192.0.2.1/24"), (router, "eth0", "192.0.2.254/24")):
        netns_exec(ns, "ip", "addr", "add", address, "dev", device)
        netns_exec(ns, "ip", "link", "set", device, "up")
    netns_exec(router, "ip", "link", "set", "lo", "up")
    netns_exec(router, "ip", "addr", "add", f"{OUTSIDE}/32", "dev", "lo")
    netns_exec(router, "ip", "route", "add", "default", "via", "192.0.2.1")
    netns_exec(host, "ip", "route", "add", "default", "via", "192.0.2.254")


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    root = tmp_path_factory.mktemp("ovs")
    secret = root / "secret"
    secret.write_bytes(SECRET)
    with ovs_daemons(root, own_netns=True) as ovs:
        netns = ovs.netns
        assert netns is not None
        t = ovs.tag
        bridge, router = f"bi{t}", f"rt{t}"
        ovs.add_bridge(bridge)
        vm = Vm(ovs, bridge, f"iv{t}", INSTANCE, "02:00:00:00:e9:01", "10.4.0.5/24", tag=1)
        agent = AgentProcess(ovs, [
            "--ovsdb", f"unix:{ovs.db_sock}", "--integration-bridge", bridge, "--metadata-bridge", f"bm{t}",
            "--meta-port", f"tm{t}", "--mode", "inport", "--upstream", "http://127.0.0.1:9",
            "--shared-secret-file", str(secret), "--state-dir", str(root / "state"), "--check-interval", "1",
        ], root / "agent.log")
        imds = Path(sys.executable).parent / "imds"
        proxy = None
        try:
            _uplink(netns, router, t)
            with (vms(vm), peer_echo(netns, "127.0.0.1", UPSTREAM_PORT), peer_echo(router, OUTSIDE, 80),
                  (root / "proxy.log").open("wb") as sink):
                agent.start()
                wait_for(lambda: "240.0.0.1/16" in netns_exec(netns, "ip", "addr", check=False),
                         what="tap-meta addressed in the host", timeout=READY_TIMEOUT, explain=agent.output)
                proxy = subprocess.Popen([
                    "ip", "netns", "exec", netns, str(imds), "proxy", "--listen", "240.0.0.1:80",
                    "--upstream", f"http://127.0.0.1:{UPSTREAM_PORT}", "--shared-secret-file", str(secret),
                    "--ovsdb", f"unix:{ovs.db_sock}", "--inport", "--integration-bridge", bridge,
                ], stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
                yield Host(ovs, netns, router, agent, vm)
        finally:
            if proxy is not None:
                stop_process(proxy)
            agent.stop()
            sh("ip", "netns", "del", router, check=False)


def test_the_vm_reads_through_the_proxy_whose_answers_leave_by_the_agents_table(host):
    """The proxy on 240.0.0.1 sees the VM as 128.0.0.0|ofport and answers it: the route to it is in table 4254."""
    def served() -> dict[str, str] | None:
        status, body = host.vm.get("http://169.254.169.254/metadata", timeout=3.0)
        return json.loads(body)["headers"] if status == 200 else None

    headers = wait_for(served, what="the VM served through imds proxy --inport", timeout=READY_TIMEOUT,
                       explain=host.agent.output)
    assert headers["x-instance-id"] == INSTANCE
    table = netns_exec(host.netns, "ip", "route", "show", "table", str(TABLE))
    assert "128.0.0.0/16 dev tm" in table
    rules = netns_exec(host.netns, "ip", "rule", "show")
    assert f"from 240.0.0.1 lookup {TABLE}" in rules
    assert f"oif tm{host.ovs.tag} lookup {TABLE}" in rules


def test_the_hosts_own_traffic_to_the_block_follows_its_own_routes(host):
    """The main table has no 128.0.0.0/16: the host reaches 128.0.0.9 through its uplink, as before the agent."""
    assert "128.0.0.0/16" not in netns_exec(host.netns, "ip", "route", "show", "table", "main")
    assert "via 192.0.2.254" in netns_exec(host.netns, "ip", "route", "get", OUTSIDE)
    out = netns_exec(host.netns, "curl", "-sS", "--max-time", "5", f"http://{OUTSIDE}/")
    assert json.loads(out)["peer"] == "192.0.2.1"  # the router saw the host's uplink address


def test_stopping_the_agent_removes_its_rules_and_table(host):
    """Run last: after the agent stops, no rule names its table and the table is empty."""
    host.agent.stop()
    assert f"lookup {TABLE}" not in netns_exec(host.netns, "ip", "rule", "show")
    assert netns_exec(host.netns, "ip", "route", "show", "table", str(TABLE)).strip() == ""
