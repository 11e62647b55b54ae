"""``imds agent`` end to end on real Open vSwitch (userspace) and haproxy, VMs in network namespaces.

One OVS, one integration bridge, one agent and three VMs are shared by the module (set-up
is the slow part); the tests run in file order, the disruptive ones (restarts, unplugging)
last. The upstream here echoes the headers haproxy forwarded, so each test sees exactly which
identity the datapath asserted for the asking VM. The switch, the agent and the upstream run
in a network namespace of their own (the test's "host"), so no other userspace switch on the
machine (a lab boot, another run) can get in their way.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import wait_for
from imds.signing import sign_stamped
from ovs_harness import READY_TIMEOUT, AgentProcess, Ovs, Vm, netns_exec, ovs_daemons, peer_echo, vms

SECRET = b"agent-test-shared-secret"
METADATA = "http://169.254.169.254/metadata"
METADATA6 = "http://[fe80::a9fe:a9fe%eth0]/metadata"
PER_SOURCE = 4  # --max-connections-per-source for this module's agent
UPSTREAM_PORT = 8775  # the echoing upstream, on the host namespace's loopback
UUID_A = "a0000000-0000-4000-8000-00000000000a"
UUID_B = "b0000000-0000-4000-8000-00000000000b"
UUID_C = "c0000000-0000-4000-8000-00000000000c"


@dataclass
class Host:
    """The shared set-up: switch, bridge names, the agent and the VMs."""

    ovs: Ovs
    bridge: str
    meta_bridge: str
    tap: str
    netns: str
    state: Path
    agent: AgentProcess
    vms: dict[str, Vm]

    def identity(self, vm: Vm, url: str = METADATA) -> tuple[int, dict[str, str]]:
        """(status, headers the upstream received) for a GET from inside ``vm``."""
        status, body = vm.get(url, timeout=4.0)
        return status, (json.loads(body)["headers"] if status == 200 else {})

    def served(self, vm: Vm, url: str = METADATA) -> bool:
        """Whether ``vm`` currently gets its own identity through the datapath."""
        status, headers = self.identity(vm, url)
        return status == 200 and headers.get("x-instance-id") == vm.uuid

    def wait_served(self, vm: Vm, url: str = METADATA, timeout: float = 40.0) -> None:
        """Poll (bounded) until ``vm`` is served; fail with the agent's log otherwise."""
        try:
            wait_for(lambda: self.served(vm, url), what=f"{vm.name} served at {url}", timeout=timeout)
        except BaseException:
            print(self.agent.output()[-4000:])  # noqa: T201 - shown by pytest on failure
            raise


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    root = tmp_path_factory.mktemp("ovs")
    with ovs_daemons(root, own_netns=True) as ovs, peer_echo(str(ovs.netns), "127.0.0.1", UPSTREAM_PORT):
        upstream = f"http://127.0.0.1:{UPSTREAM_PORT}"
        t = ovs.tag
        bridge, meta_bridge, tap, netns = f"bi{t}", f"bm{t}", f"tm{t}", f"imdsmeta{t}"
        state = root / "state"
        secret = root / "secret"
        secret.write_bytes(SECRET)
        ovs.add_bridge(bridge)
        machines = (
            Vm(ovs, bridge, f"va{t}", UUID_A, "02:00:00:00:0a:01", "10.0.0.5/24", tag=1, tenant="tenant-a"),
            Vm(ovs, bridge, f"vb{t}", UUID_B, "02:00:00:00:0b:01", "10.0.0.5/24", tag=2),
            Vm(ovs, bridge, f"vc{t}", UUID_C, "02:00:00:00:0c:01", "10.0.0.6/24", tag=1),
        )
        agent = AgentProcess(ovs, [
            "--ovsdb", f"unix:{ovs.db_sock}", "--integration-bridge", bridge, "--metadata-bridge", meta_bridge,
            "--meta-port", tap, "--meta-netns", netns, "--upstream", upstream, "--shared-secret-file", str(secret),
            "--state-dir", str(state), "--check-interval", "0.5", "--max-connections-per-source", str(PER_SOURCE),
        ], root / "agent.log")
        try:
            with vms(*machines):
                agent.start()
                yield Host(ovs, bridge, meta_bridge, tap, netns, state, agent, {vm.uuid: vm for vm in machines})
        finally:
            agent.stop()
            ovs.remove(meta_bridge, bridge, netns=netns)


def test_two_vms_with_one_ip_each_get_their_own_identity(host):
    """Two VMs on different networks with the same IP, and a third, each reach 169.254.169.254 as themselves."""
    for vm in host.vms.values():
        host.wait_served(vm)
        status, headers = host.identity(vm)
        assert status == 200
        assert headers["x-instance-id"] == vm.uuid
        stamp = int(headers["x-instance-id-timestamp"])  # haproxy's clock, this request's
        assert abs(stamp - time.time()) < 30
        assert headers["x-instance-id-signature"] == sign_stamped(SECRET, vm.uuid, stamp, vm.tenant)
    _, headers_a = host.identity(host.vms[UUID_A])
    _, headers_b = host.identity(host.vms[UUID_B])
    assert headers_a["x-tenant-id"] == "tenant-a"
    assert "x-tenant-id" not in headers_b


def test_ipv6_link_local_metadata_address(host):
    """A VM reaching [fe80::a9fe:a9fe] is served as itself too (NA responder, Meta IPv6)."""
    for vm in (host.vms[UUID_A], host.vms[UUID_B]):
        host.wait_served(vm, METADATA6, timeout=20.0)


def test_each_read_is_logged_with_its_instance_id_and_never_its_query(host):
    """A read through the datapath reaches the agent's own log: port, id, tenant, method, path, status, timings.

    The query string (where a token could ride) and the answer's body never do.
    """
    vm = host.vms[UUID_A]
    host.wait_served(vm)
    status, body = vm.get(f"{METADATA}?token=query-secret-7f3a", timeout=4.0)
    assert status == 200
    assert "query-secret-7f3a" in body  # the upstream got it: the request was forwarded whole

    def logged() -> dict[str, object] | None:
        for line in host.agent.output().splitlines():
            entry = json.loads(line) if line.startswith("{") else {}
            if entry.get("event") == "haproxy.request" and entry.get("instance_id") == UUID_A:
                return entry
        return None

    entry = wait_for(logged, what="the read in the agent's log", timeout=READY_TIMEOUT)
    assert (entry["port"], entry["tenant"], entry["method"], entry["path"]) == (vm.port, "tenant-a", "GET", "/metadata")
    assert entry["status"] == 200
    assert entry["source"] == _other_config(host, vm)["provider_ip"]
    assert isinstance(entry["bytes"], int)
    assert entry["bytes"] > 0
    assert isinstance(entry["total_ms"], int)
    assert entry["total_ms"] >= 0
    assert "query-secret-7f3a" not in host.agent.output()
    assert "x-instance-id-signature" not in host.agent.output().lower()


def test_haproxy_workers_are_not_root_and_see_an_empty_root(host):
    """The workers (which every VM talks to) run as imds-haproxy, chrooted to an empty directory; the master is root."""
    master = _haproxy_master(host)
    assert master is not None
    workers = _children(master)
    assert workers
    expected = pwd.getpwnam("imds-haproxy")
    for pid in workers:
        uids = _status(pid, "Uid").split()
        gids = _status(pid, "Gid").split()
        assert uids == [str(expected.pw_uid)] * 4, uids
        assert gids == [str(expected.pw_gid)] * 4, gids
        root = Path(f"/proc/{pid}/root").readlink()
        assert root == (host.state / "haproxy-root").resolve()
        assert list(root.iterdir()) == []
    assert _status(master, "Uid").split()[0] == "0"


def _status(pid: int, field: str) -> str:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith(f"{field}:"))
    return line.split(":", 1)[1].strip()


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(entry.name))
    return found


def test_meta_addresses_are_stored_unique_and_in_range(host):
    """Each port's Meta IP/MAC/IPv6 live in its Interface other_config, distinct, from the provider ranges."""
    stored = {vm.uuid: _other_config(host, vm) for vm in host.vms.values()}
    ips = {c["provider_ip"] for c in stored.values()}
    macs = {c["provider_mac"] for c in stored.values()}
    assert len(ips) == len(macs) == 3
    assert all(ip.startswith("240.0.") and ip != "240.0.0.1" for ip in ips)
    assert all(mac.startswith("fa:16:ee:") and mac != "fa:16:ee:00:00:01" for mac in macs)
    assert all(c["provider_ip6"].startswith("fd00:a9fe::") for c in stored.values())


def test_client_sent_identity_headers_are_replaced(host):
    """A VM cannot claim another's identity with headers: haproxy overwrites them."""
    vm = host.vms[UUID_B]
    status, body = vm.get(METADATA, "-H", f"X-Instance-ID: {UUID_A}", "-H", "X-Instance-ID-Signature: 00",
                          "-H", "X-Tenant-ID: tenant-a", "-H", "X-Instance-ID-Timestamp: 1")
    assert status == 200
    headers = json.loads(body)["headers"]
    assert headers["x-instance-id"] == UUID_B
    stamp = int(headers["x-instance-id-timestamp"])
    assert abs(stamp - time.time()) < 30
    assert headers["x-instance-id-signature"] == sign_stamped(SECRET, UUID_B, stamp)
    assert "x-tenant-id" not in headers


def test_unknown_source_gets_404_from_haproxy(host):
    """A source that is no VM's Meta address gets haproxy's own 404 (nothing is forwarded)."""
    result = subprocess.run(
        ["ip", "netns", "exec", host.netns, "curl", "-sS", "--max-time", "5", "-w", "\n%{http_code}",
         "http://240.0.0.1/metadata"], capture_output=True, text=True, timeout=20, check=False,
    )
    body, _, code = result.stdout.rpartition("\n")
    assert code == "404", result
    assert "no instance is associated" in body


def test_spoofed_mac_and_ip_get_nothing(host):
    """A VM taking another VM's MAC and IP on its own port gets no answer at all."""
    victim, spoofer = host.vms[UUID_A], host.vms[UUID_C]
    host.wait_served(spoofer)
    netns_exec(spoofer.name, "ip", "link", "set", "eth0", "address", victim.mac)
    netns_exec(spoofer.name, "ip", "addr", "replace", victim.ip, "dev", "eth0")
    try:
        status, _ = spoofer.get(METADATA, timeout=3.0)
        assert status == 0
    finally:
        netns_exec(spoofer.name, "ip", "addr", "del", victim.ip, "dev", "eth0")
        netns_exec(spoofer.name, "ip", "link", "set", "eth0", "address", spoofer.mac)
    host.wait_served(spoofer)
    host.wait_served(victim)


def test_spoofed_ip_alone_still_gets_own_identity(host):
    """Identity is the port: a VM using another VM's IP (own MAC) is still served as itself."""
    victim, spoofer = host.vms[UUID_A], host.vms[UUID_C]
    netns_exec(spoofer.name, "ip", "addr", "add", "10.0.0.5/24", "dev", "eth0")
    try:
        status, body = spoofer.get(METADATA, "--interface", "10.0.0.5")
        assert status == 200
        assert json.loads(body)["headers"]["x-instance-id"] == UUID_C
    finally:
        netns_exec(spoofer.name, "ip", "addr", "del", "10.0.0.5/24", "dev", "eth0")
    assert victim.uuid != UUID_C


# Run inside a VM's namespace: hold PER_SOURCE connections, try one more, then use a held one.
_HOLD = """
import socket, sys
limit = int(sys.argv[1])
request = b"GET /metadata HTTP/1.1\\r\\nHost: 169.254.169.254\\r\\nConnection: close\\r\\n\\r\\n"

def answer(sock):
    sock.settimeout(10)
    data = b""
    try:
        sock.sendall(request)
        while chunk := sock.recv(65536):
            data += chunk
    except OSError as exc:
        return type(exc).__name__
    return data.split(b"\\r\\n", 1)[0].decode() or "closed"

held = [socket.create_connection(("169.254.169.254", 80), timeout=10) for _ in range(limit)]
print("extra:", answer(socket.create_connection(("169.254.169.254", 80), timeout=10)), flush=True)
print("held:", answer(held[0]), flush=True)
"""


def test_one_vm_cannot_hold_more_than_its_connections(host):
    """VM A holding PER_SOURCE connections gets its next one closed at accept; B (same IP, other net) is served."""
    vm, other = host.vms[UUID_A], host.vms[UUID_B]
    host.wait_served(vm)
    with subprocess.Popen(["ip", "netns", "exec", vm.name, sys.executable, "-c", _HOLD, str(PER_SOURCE)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as holder:
        assert holder.stdout is not None
        assert holder.stderr is not None
        extra = holder.stdout.readline().strip()
        # An empty line: the holder died (its traceback says where); seen once in CI, cause not known yet.
        assert extra in {"extra: closed", "extra: ConnectionResetError"}, extra or holder.stderr.read()
        assert host.served(other)  # its own counter: same 10.0.0.5, another port
        held = holder.stdout.readline().strip()
        assert held == "held: HTTP/1.1 200 OK", held
        assert holder.wait(timeout=30) == 0
    host.wait_served(vm)  # its connections closed: served again


def test_flows_carry_the_agent_cookie(host):
    """Every rule the agent installed on both bridges carries its cookie (so a resync can replace them)."""
    ours = "cookie=0x494d445300000000/0xffffffff00000000"
    assert len(host.ovs.flows(host.meta_bridge, ours)) == len(host.ovs.flows(host.meta_bridge))
    ofport = host.ovs.ofport(host.vms[UUID_A].port)
    assert any(f"in_port={ofport}" in flow for flow in host.ovs.flows(host.bridge, ours))


def test_stale_agent_rules_are_removed(host):
    """A rule carrying the agent's cookie that it did not render (left from an old run) is removed."""
    stale = "cookie=0x494d445300000000,table=0,priority=5,dl_src=02:de:ad:00:00:01,actions=drop"
    host.ovs.ofctl("add-flow", host.bridge, stale)
    assert any("02:de:ad:00:00:01" in f for f in host.ovs.flows(host.bridge))
    wait_for(lambda: not any("02:de:ad:00:00:01" in f for f in host.ovs.flows(host.bridge)),
             what="the stale rule to go", timeout=READY_TIMEOUT)
    host.wait_served(host.vms[UUID_A])


def test_haproxy_reload_under_requests_loses_none(host):
    """Requests running while ports come and go (each change reloads haproxy) all succeed."""
    vm = host.vms[UUID_A]
    host.wait_served(vm)
    results: list[str] = []
    done = threading.Event()

    def loop() -> None:
        # Batches of 25 fresh connections until the reloads are over (bounded: at most 40 batches).
        urls = [arg for n in range(25) for arg in ("-o", "/dev/null", f"{METADATA}?n={n}")]
        for _ in range(40):
            out = netns_exec(vm.name, "curl", "-s", "--max-time", "10", "-H", "Connection: close",
                             "-w", "%{http_code}\n", *urls, check=False, timeout=120)
            results.extend(out.split())
            if done.is_set():
                return

    worker = threading.Thread(target=loop)
    worker.start()
    reloads_before = host.agent.output().count("agent.haproxy_applied")
    backends_before = _haproxy_config(host).count("backend vm")
    for n in range(3):
        name = f"x{host.ovs.tag}{n}"
        host.ovs.vsctl("add-port", host.bridge, name, "--", "set", "Interface", name, "type=internal",
                       f"external_ids:vm-uuid=d000000{n}-0000-4000-8000-000000000000",
                       "external_ids:attached-mac=02:00:00:00:0d:0" + str(n))
        wait_for(lambda name=name: f"port {name}" in _haproxy_config(host),
                 what=f"haproxy backend for {name}", timeout=READY_TIMEOUT)
        host.ovs.vsctl("del-port", host.bridge, name)
        wait_for(lambda name=name: f"port {name}" not in _haproxy_config(host),
                 what=f"backend of {name} gone", timeout=READY_TIMEOUT)
    wait_for(lambda: host.agent.output().count("agent.haproxy_applied") - reloads_before == 6,
             what="six reloads", timeout=READY_TIMEOUT)
    done.set()
    worker.join(timeout=120)
    assert backends_before == _haproxy_config(host).count("backend vm")
    assert len(results) >= 50
    assert len(results) % 25 == 0
    assert set(results) == {"200"}, results


def test_haproxy_dying_is_restarted_by_the_agent(host):
    """If the host's haproxy dies, the agent's periodic check starts it again."""
    master = _haproxy_master(host)
    os.kill(master, signal.SIGKILL)
    wait_for(lambda: _haproxy_master(host, missing_ok=True) not in (None, master),
             what="a new haproxy master", timeout=READY_TIMEOUT)
    for vm in host.vms.values():
        host.wait_served(vm)
    assert "agent.haproxy_died" in host.agent.output()


def _haproxy_master(host: Host, *, missing_ok: bool = False) -> int | None:
    """The master's PID from its own CLI socket (``show proc``)."""
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(host.state / "haproxy-master.sock"))
            sock.sendall(b"show proc\n")
            sock.shutdown(socket.SHUT_WR)
            text = sock.makefile().read()
    except OSError:
        if missing_ok:
            return None
        raise
    return next(int(line.split()[0]) for line in text.splitlines() if " master " in f" {line} ")


def test_agent_restart_keeps_meta_addresses(host):
    """A restarted agent reads each port's Meta IP/MAC back from OVSDB and keeps serving with them."""
    before = {vm.uuid: _other_config(host, vm) for vm in host.vms.values()}
    host.agent.stop()
    host.agent.start()
    for vm in host.vms.values():
        host.wait_served(vm)
    assert {vm.uuid: _other_config(host, vm) for vm in host.vms.values()} == before


def test_killed_agent_leaves_no_second_haproxy(host):
    """An agent killed outright leaves its haproxy running; the next agent stops that one first."""
    orphan = _haproxy_master(host)
    host.agent.process.kill()  # type: ignore[union-attr]
    host.agent.process.wait(timeout=10)  # type: ignore[union-attr]
    assert _alive(orphan)
    host.agent.start()
    wait_for(lambda: not _alive(orphan), what="the orphaned haproxy to go", timeout=READY_TIMEOUT)
    for vm in host.vms.values():
        host.wait_served(vm)
    assert _haproxy_master(host) != orphan


def _alive(pid: int | None) -> bool:
    """Running (a zombie left for init to reap counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_switch_restart_is_repaired_by_the_agent(host):
    """ovs-vswitchd restarting loses every flow; the agent notices and puts the datapath back."""
    host.ovs.restart_switch()
    for vm in (host.vms[UUID_A], host.vms[UUID_B]):
        host.wait_served(vm, timeout=60.0)
    host.wait_served(host.vms[UUID_A], METADATA6, timeout=60.0)
    assert "agent.flows_missing" in host.agent.output() or "agent.switch_unreachable" in host.agent.output()


def test_removed_port_loses_flows_backend_and_addresses(host):
    """Unplugging a VM removes its rules, its haproxy backend, and (with the row) its Meta addresses."""
    vm = host.vms[UUID_C]
    ofport = host.ovs.ofport(vm.port)
    host.wait_served(vm)
    vm.unplug()

    def gone() -> bool:
        flows = host.ovs.flows(host.bridge)
        return UUID_C not in _haproxy_config(host) and not any(f"in_port={ofport}," in f for f in flows)

    wait_for(gone, what="the unplugged port's rules and backend to go", timeout=READY_TIMEOUT)
    assert not any(f"0x494d444c{ofport:08x}" in f for f in host.ovs.flows(host.bridge, "table=210"))
    host.wait_served(host.vms[UUID_A])


def _other_config(host: Host, vm: Vm) -> dict[str, str]:
    return _ovs_map(host.ovs.vsctl("get", "Interface", vm.port, "other_config"))


def _ovs_map(text: str) -> dict[str, str]:
    """``{provider_ip="240.0.0.2", provider_mac="fa:…"}`` as a dict."""
    body = text.strip().strip("{}")
    pairs = [item.split("=", 1) for item in body.split(", ") if "=" in item]
    return {k.strip(): v.strip().strip('"') for k, v in pairs}


def _haproxy_config(host: Host) -> str:
    path = host.state / "haproxy.cfg"
    return path.read_text() if path.exists() else ""
