"""``imds agent --mode inport`` and a provider range that runs out, on real OVS (and haproxy).

In-port mode rewrites a VM's source to ``128.0.0.0 | ofport`` (Dragonflow's encoding): here a
peer inside the metadata namespace answers with the address it saw, so the test reads exactly
what ``imds proxy --inport`` gets to map back through OVSDB.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import wait_for
from imds.signing import sign_stamped
from ovs_harness import (
    AgentProcess,
    Ovs,
    Vm,
    echo_upstream,
    ovs_daemons,
    peer_echo,
    sh,
    stop_process,
    vms,
)

SECRET = b"agent-modes-secret"


@pytest.fixture(scope="module")
def ovs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ovs]:
    with ovs_daemons(tmp_path_factory.mktemp("ovs")) as switch:
        yield switch


def _agent(
    ovs: Ovs, root: Path, suffix: str, upstream: str, *extra: str, netns: bool = True
) -> tuple[AgentProcess, dict[str, str]]:
    t = ovs.tag + suffix
    names = {"bridge": f"bi{t}", "meta_bridge": f"bm{t}", "tap": f"tm{t}", "netns": f"imdsmeta{t}"}
    ovs.add_bridge(names["bridge"])
    secret = root / "secret"
    secret.write_bytes(SECRET)
    where = ["--meta-netns", names["netns"]] if netns else []
    agent = AgentProcess(ovs, [
        "--ovsdb", f"unix:{ovs.db_sock}", "--integration-bridge", names["bridge"],
        "--metadata-bridge", names["meta_bridge"], "--meta-port", names["tap"], *where,
        "--upstream", upstream, "--shared-secret-file", str(secret), "--state-dir", str(root / "state"),
        "--check-interval", "0.5", *extra,
    ], root / "agent.log")
    return agent, names


def _cleanup(ovs: Ovs, agent: AgentProcess, names: dict[str, str]) -> None:
    agent.stop()
    ovs.remove(names["meta_bridge"], names["bridge"], netns=names["netns"])


def test_inport_mode_rewrites_source_to_128_0_0_0_or_ofport(ovs, tmp_path):
    """Each VM reaches 169.254.169.254 and the listener sees it as 128.0.0.0 | its ofport."""
    agent, names = _agent(ovs, tmp_path, "i", "http://127.0.0.1:9", "--mode", "inport")
    t = ovs.tag
    machines = (
        Vm(ovs, names["bridge"], f"vp{t}", "f0000000-0000-4000-8000-00000000000f", "02:00:00:00:0f:01",
           "10.1.0.5/24", tag=3),
        Vm(ovs, names["bridge"], f"vq{t}", "f1000000-0000-4000-8000-00000000000f", "02:00:00:00:0f:02",
           "10.1.0.5/24", tag=4),
    )
    try:
        with vms(*machines):
            agent.start()
            wait_for(lambda: "240.0.0.1/16" in sh("ip", "netns", "exec", names["netns"], "ip", "addr", check=False),
                     what="tap-meta addressed in its namespace", timeout=30)
            with peer_echo(names["netns"], "240.0.0.1", 80):
                for vm in machines:
                    expected = str(ipaddress.IPv4Address("128.0.0.0") + ovs.ofport(vm.port))
                    wait_for(lambda vm=vm, expected=expected: _peer(vm) == expected,
                             what=f"{vm.name} seen as {expected}", timeout=30)
            assert not (tmp_path / "state" / "haproxy.cfg").exists()
    finally:
        _cleanup(ovs, agent, names)


def test_exhausted_range_is_a_clear_error_and_the_rest_are_served(ovs, tmp_path):
    """With room for one VM, the second port is logged as exhausted and gets no Meta address."""
    with echo_upstream() as upstream:
        agent, names = _agent(ovs, tmp_path, "x", upstream, "--provider-cidr", "240.0.0.0/30")
        ports = [f"xa{ovs.tag}", f"xb{ovs.tag}"]
        try:
            for n, port in enumerate(ports):
                ovs.vsctl("add-port", names["bridge"], port, "--", "set", "Interface", port, "type=internal",
                          f"external_ids:vm-uuid=e000000{n}-0000-4000-8000-000000000000",
                          f"external_ids:attached-mac=02:00:00:00:0e:0{n}")
            agent.start()
            wait_for(lambda: "agent.pool_exhausted" in agent.output(), what="the exhaustion error", timeout=30)
            line = next(x for x in agent.output().splitlines() if "agent.pool_exhausted" in x)
            assert ports[1] in line
            assert "240.0.0.0/30 is exhausted" in line
            assert ovs.vsctl("get", "Interface", ports[0], "other_config:provider_ip").strip() == '"240.0.0.2"'
            assert "provider_ip" not in ovs.vsctl("get", "Interface", ports[1], "other_config")
            wait_for((tmp_path / "state" / "haproxy.cfg").exists, what="haproxy config", timeout=30)
            config = (tmp_path / "state" / "haproxy.cfg").read_text()
            assert "e0000000-" in config
            assert "e0000001-" not in config
            assert agent.alive()
        finally:
            _cleanup(ovs, agent, names)


def test_tap_meta_in_the_hosts_own_namespace(ovs, tmp_path):
    """Without --meta-netns, tap-meta and haproxy stay in the host's namespace (a per-run range here)."""
    octet = int(ovs.tag, 16) % 200 + 20
    cidr, cidr6 = f"240.{octet}.0.0/16", f"fd00:a9fe:{ovs.tag}::/64"
    with echo_upstream() as upstream:
        agent, names = _agent(ovs, tmp_path, "r", upstream, "--provider-cidr", cidr, "--provider-cidr6", cidr6,
                              netns=False)
        vm = Vm(ovs, names["bridge"], f"vr{ovs.tag}", "e1000000-0000-4000-8000-00000000000e", "02:00:00:00:0e:11",
                "10.2.0.5/24")
        try:
            with vms(vm):
                agent.start()
                for url in ("http://169.254.169.254/metadata", "http://[fe80::a9fe:a9fe%eth0]/metadata"):
                    wait_for(lambda url=url: vm.get(url, timeout=3.0)[0] == 200, what=f"served at {url}", timeout=30)
                    status, body = vm.get(url)
                    assert (status, json.loads(body)["headers"]["x-instance-id"]) == (200, vm.uuid)
                assert f"240.{octet}.0.1/16" in sh("ip", "addr", "show", "dev", names["tap"])
        finally:
            _cleanup(ovs, agent, names)


def _peer(vm: Vm) -> str | None:
    status, body = vm.get("http://169.254.169.254/", timeout=3.0)
    return json.loads(body)["peer"] if status == 200 else None


def test_inport_mode_served_by_imds_proxy_inport(ovs, tmp_path):
    """Imds proxy --inport behind the in-port flows signs each VM's own id (two VMs, one IP)."""
    agent, names = _agent(ovs, tmp_path, "p", "http://127.0.0.1:9", "--mode", "inport")
    t = ovs.tag
    machines = (
        Vm(ovs, names["bridge"], f"vs{t}", "f2000000-0000-4000-8000-00000000000f", "02:00:00:00:0f:11",
           "10.3.0.5/24", tag=3, tenant="tenant-s"),
        Vm(ovs, names["bridge"], f"vt{t}", "f3000000-0000-4000-8000-00000000000f", "02:00:00:00:0f:12",
           "10.3.0.5/24", tag=4),
    )
    imds = Path(sys.executable).parent / "imds"
    proxy = None
    try:
        with vms(*machines):
            agent.start()
            wait_for(lambda: "240.0.0.1/16" in sh("ip", "netns", "exec", names["netns"], "ip", "addr", check=False),
                     what="tap-meta addressed in its namespace", timeout=30)
            # The upstream lives in the metadata namespace too, where the proxy can reach it.
            with peer_echo(names["netns"], "127.0.0.1", 8775), (tmp_path / "proxy.log").open("wb") as sink:
                proxy = subprocess.Popen([
                    "ip", "netns", "exec", names["netns"], str(imds), "proxy", "--listen", "240.0.0.1:80",
                    "--upstream", "http://127.0.0.1:8775", "--shared-secret-file", str(tmp_path / "secret"),
                    "--ovsdb", f"unix:{ovs.db_sock}", "--inport", "--integration-bridge", names["bridge"],
                ], stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
                for vm in machines:
                    wait_for(lambda vm=vm: vm.get("http://169.254.169.254/metadata", timeout=3.0)[0] == 200,
                             what=f"{vm.name} served by imds proxy", timeout=30)
                    status, body = vm.get("http://169.254.169.254/metadata")
                    headers = json.loads(body)["headers"]
                    assert status == 200
                    assert headers["x-instance-id"] == vm.uuid
                    stamp = int(headers["x-instance-id-timestamp"])
                    assert abs(stamp - time.time()) < 30
                    assert headers["x-instance-id-signature"] == sign_stamped(SECRET, vm.uuid, stamp, vm.tenant)
                    assert headers.get("x-tenant-id") == vm.tenant
    finally:
        if proxy is not None:
            stop_process(proxy)
        _cleanup(ovs, agent, names)
