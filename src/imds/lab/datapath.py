"""The guest's network, built the way a compute host has it: userspace OVS, os-vif's port, the agent.

All of it in a network namespace made for the run, its host (``imds.lab.hostns``):

- a private Open vSwitch (``imds.lab.switch``);
- ``br-int`` (userspace datapath, ``fail_mode=secure``) with one rule of the lab's own, plain
  L2 switching at the lowest priority, as Neutron's OVS agent installs; VLAN tags isolate;
- the guest's tap plugged as Nova/os-vif plugs a port: ``external_ids`` ``iface-id``,
  ``attached-mac``, ``vm-uuid``, ``iface-status=active`` (no tenant), Port ``tag`` 1;
- dnsmasq in a namespace on the same VLAN (the DHCP port) handing the guest its address and
  the way to 169.254.169.254 (``Route``: on-link or via the DHCP port by option 121, or a
  default route to the router, a namespace answering for the gateway address as Neutron's
  router does); IPv6-only, no DHCPv4 at all but router advertisements (SLAAC on
  fd00:231::/64, dnsmasq the default router) and DHCPv6;
- ``imds agent`` (which renders and runs haproxy, its workers as ``imds-haproxy``, made here
  when missing) serving that port from ``--upstream``: a relay inside the namespace to the
  ``imds serve`` the lab pushed the record to;
- with ``Route.dhcp_gone`` (``--route dhcp --dhcp-gone``), the DHCP port goes once the guest
  has its lease (dnsmasq stopped, its port and namespace removed: the seed's upgrade case) and
  the agent answers ARP for its address itself (``--metadata-next-hop``).

Every name carries the run's tag, so two runs never collide; each is undone by name or PID.
The host namespace gives the run's switch an ``ovs-netdev`` tap of its own (every userspace
switch opens one in its namespace), so a run waits for no other switch on the machine.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from imds.errors import LabError
from imds.lab.hostns import HostNs, relay
from imds.lab.run import Cleanup, ensure_system_user, sh, spawn, stop, tool_env, wait_until
from imds.lab.switch import READY_TIMEOUT, Switch

VLAN = 1
NETWORK = ipaddress.IPv4Network("10.231.0.0/24")
DHCP_SERVER = "10.231.0.1"
GUEST_IP = "10.231.0.10"
GATEWAY = "10.231.0.254"  # the router's address (--route gateway)
NETWORK6 = ipaddress.IPv6Network("fd00:231::/64")
DHCP_SERVER6 = "fd00:231::1"
GUEST_IP6 = "fd00:231::10"  # DHCPv6's one address; the guest also has its SLAAC address (slaac_address)
RA_LIFETIME = 1800  # seconds the guest keeps dnsmasq as its IPv6 default router
LAB_COOKIE = 0x4C4142  # "LAB": the lab's own rules on br-int (never the agent's cookie)
HAPROXY_USER = "imds-haproxy"  # imds agent's default --haproxy-user
TOOLS = ("ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl", "ovsdb-tool", "haproxy", "ip", "dnsmasq",
         "nsenter")


def require_tools() -> None:
    """LabError naming every missing program the datapath needs."""
    missing = [tool for tool in TOOLS if shutil.which(tool, path=tool_env()["PATH"]) is None]
    if missing:
        msg = (f"missing {', '.join(missing)}: "
               "apt-get install openvswitch-switch haproxy iproute2 dnsmasq-base util-linux")
        raise LabError(msg)


def slaac_address(mac: str) -> str:
    """The address SLAAC gives a NIC with ``mac`` on the lab's IPv6 network (modified EUI-64)."""
    octets = [int(part, 16) for part in mac.split(":")]
    octets[0] ^= 0x02
    eui = bytes([*octets[:3], 0xFF, 0xFE, *octets[3:]])
    return str(NETWORK6.network_address + int.from_bytes(eui, "big"))


@dataclass(frozen=True)
class Route:
    """How the guest reaches metadata: ``onlink``, ``dhcp`` (via the DHCP port) or ``gateway``; or IPv6 only.

    ``dhcp_gone``: the DHCP port is removed after the lease, and the agent answers for its address.
    """

    route: str = "onlink"
    ipv6_only: bool = False
    dhcp_gone: bool = False

    @property
    def next_hops(self) -> tuple[str, ...]:
        """What the agent answers ARP for (``--metadata-next-hop``): the DHCP port's address once it is gone."""
        return (DHCP_SERVER,) if self.dhcp_gone else ()

    def dnsmasq_args(self, guest_mac: str) -> list[str]:
        """The DHCP (and router advertisement) arguments dnsmasq gets for this guest."""
        if self.ipv6_only:
            return ["--enable-ra", f"--ra-param=eth0,10,{RA_LIFETIME}",
                    f"--dhcp-range={GUEST_IP6},{GUEST_IP6},slaac,{NETWORK6.prefixlen},1h"]
        args = [f"--dhcp-range={GUEST_IP},static,{NETWORK.netmask},1h", f"--dhcp-host={guest_mac},{GUEST_IP}"]
        if self.route == "onlink":
            return [*args, "--dhcp-option=121,169.254.169.254/32,0.0.0.0"]
        if self.route == "dhcp":
            return [*args, f"--dhcp-option=121,169.254.169.254/32,{DHCP_SERVER}"]
        if self.route == "gateway":
            return [*args, f"--dhcp-option=3,{GATEWAY}"]
        msg = f"unknown route {self.route!r}: one of onlink, dhcp, gateway"
        raise LabError(msg)

    @property
    def name(self) -> str:
        """What result.json calls it: the route, or ``ipv6-router`` (the advertised default router)."""
        return "ipv6-router" if self.ipv6_only else self.route

    @property
    def router(self) -> bool:
        """Whether the lab runs a router answering for the gateway address."""
        return self.route == "gateway" and not self.ipv6_only


@dataclass
class Names:
    """Every device, bridge and namespace name of one run (15-character interface limit)."""

    tag: str

    @property
    def host(self) -> HostNs:
        """The run's own network namespace, where the switch, the agent and the taps live."""
        return HostNs(f"imdslab-host-{self.tag}")

    @property
    def bridge(self) -> str:
        """The integration bridge."""
        return f"lbi{self.tag}"

    @property
    def meta_bridge(self) -> str:
        """The agent's metadata bridge."""
        return f"lbm{self.tag}"

    @property
    def meta_port(self) -> str:
        """The agent's tap-meta."""
        return f"ltm{self.tag}"

    @property
    def meta_netns(self) -> str:
        """Where haproxy listens."""
        return f"imdslab-meta-{self.tag}"

    @property
    def dhcp_netns(self) -> str:
        """Where dnsmasq runs."""
        return f"imdslab-dhcp-{self.tag}"

    @property
    def dhcp_port(self) -> str:
        """The host end of dnsmasq's veth."""
        return f"ldh{self.tag}"

    @property
    def router_netns(self) -> str:
        """The router's namespace (--route gateway)."""
        return f"imdslab-rtr-{self.tag}"

    @property
    def router_port(self) -> str:
        """The host end of the router's veth."""
        return f"lrt{self.tag}"

    @property
    def tap(self) -> str:
        """The guest's tap."""
        return f"lvm{self.tag}"

    @property
    def hot_tap(self) -> str:
        """The tap of a NIC hot-added to the running guest (--hotplug)."""
        return f"lvm{self.tag}h"

    @property
    def qmp(self) -> Path:
        """QEMU's QMP socket (a short path: a Unix socket's is at most 107 bytes)."""
        return Path(f"/tmp/imdslab-{self.tag}.qmp")  # noqa: S108 - a socket QEMU creates, named by the run's tag


@dataclass
class Guest:
    """The guest's port: instance id, MAC and the tap QEMU opens."""

    uuid: str
    mac: str
    tap: str


@dataclass
class Datapath:
    """One run's network: where its logs go, its names, and what undoes it."""

    cleanup: Cleanup
    out: Path
    names: Names
    switch: Switch | None = None
    dnsmasq: subprocess.Popen[bytes] | None = None  # the DHCP port's (imds.lab.dhcpgone stops it)

    def build(self, guest: Guest, upstream: str, secret_file: Path, route: Route) -> Switch:
        """OVS, br-int, dnsmasq's namespace (and the router's) and the guest's tap, plugged; then the agent."""
        require_tools()
        names = self.names
        names.host.create(self.cleanup)
        switch = Switch(self.cleanup, self.out, names.tag, names.host)
        self.cleanup.add(f"del-br {names.bridge}", lambda: switch.vsctl("--if-exists", "del-br", names.bridge))
        switch.vsctl("add-br", names.bridge, "--", "set", "Bridge", names.bridge, "datapath_type=netdev",
                     "fail_mode=secure")
        # ovs-ofctl reaches the bridge through its management socket, which ovs-vswitchd may create late.
        wait_until(f"{names.bridge}.mgmt", (switch.root / f"{names.bridge}.mgmt").exists, READY_TIMEOUT)
        switch.ofctl("add-flow", names.bridge, f"cookie={LAB_COOKIE:#x},priority=0,actions=NORMAL")
        self._namespace(switch, names.dhcp_netns, names.dhcp_port, DHCP_SERVER, DHCP_SERVER6)
        if route.router:
            self._namespace(switch, names.router_netns, names.router_port, GATEWAY)
        self._guest_tap(switch, guest)
        self._dnsmasq(guest, route)
        self._agent(switch, upstream, secret_file, route.next_hops)
        self.switch = switch
        # Undone first: the rules with their packet counts, as the guest left them (what matched, what did not).
        self.cleanup.add("keep the flows", lambda: (self.out / "flows.txt").write_text(
            switch.ofctl("dump-flows", names.bridge) + switch.ofctl("dump-flows", names.meta_bridge)))
        return switch

    def plug(self, switch: Switch, guest: Guest, vlan: int) -> None:
        """Another port of a running guest (a NIC about to be hot-added), plugged on ``vlan``."""
        self._guest_tap(switch, guest, vlan)

    def unplug(self, switch: Switch, tap: str) -> None:
        """A port unplugged again (its NIC detached): off the bridge, the tap deleted."""
        switch.vsctl("--if-exists", "del-port", self.names.bridge, tap)
        sh(*self.names.host.ip("link", "del", tap), check=False)

    def _namespace(self, switch: Switch, ns: str, port: str, address: str, address6: str | None = None) -> None:
        """A namespace on the VM VLAN through a veth: the DHCP port, or the router (the kernel answers ARP)."""
        self.cleanup.command("ip", "netns", "del", ns)
        sh("ip", "netns", "add", ns)
        host = self.names.host
        self.cleanup.command(*host.ip("link", "del", port))
        sh(*host.ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns))
        addresses: list[tuple[str, ...]] = [("ip", "addr", "add", f"{address}/{NETWORK.prefixlen}", "dev", "eth0")]
        if address6:
            addresses.append(("ip", "addr", "add", f"{address6}/{NETWORK6.prefixlen}", "dev", "eth0", "nodad"))
        for args in (("sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0"),
                     ("sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0"),
                     ("ip", "link", "set", "lo", "up"),
                     *addresses,
                     ("ip", "link", "set", "eth0", "up")):
            sh("ip", "netns", "exec", ns, *args)
        # veth into the userspace datapath: checksums must be complete (offload off), as in the agent tests.
        sh("ip", "netns", "exec", ns, "ethtool", "-K", "eth0", "tx", "off", check=False)
        sh(*host.ip("link", "set", port, "up"))
        bridge = self.names.bridge
        self.cleanup.add(f"del-port {port}", lambda: switch.vsctl("--if-exists", "del-port", bridge, port))
        switch.vsctl("add-port", bridge, port, f"tag={VLAN}")

    def _guest_tap(self, switch: Switch, guest: Guest, vlan: int = VLAN) -> None:
        """The tap QEMU attaches to, plugged as os-vif plugs a Nova port."""
        host = self.names.host
        self.cleanup.command(*host.ip("link", "del", guest.tap))
        sh(*host.ip("tuntap", "add", "dev", guest.tap, "mode", "tap"))
        sh(*host.ip("link", "set", guest.tap, "up"))
        bridge = self.names.bridge
        self.cleanup.add(f"del-port {guest.tap}", lambda: switch.vsctl("--if-exists", "del-port", bridge, guest.tap))
        port_id = str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"imds-lab:{guest.uuid}:{guest.mac}"))
        switch.vsctl("add-port", bridge, guest.tap, f"tag={vlan}", "--", "set", "Interface", guest.tap,
                     f"external_ids:iface-id={port_id}", f"external_ids:attached-mac={guest.mac}",
                     f"external_ids:vm-uuid={guest.uuid}", "external_ids:iface-status=active")

    def _dnsmasq(self, guest: Guest, route: Route) -> None:
        """DHCP for the guest only: its fixed address and the ``route`` to 169.254.169.254 (or IPv6 only).

        It is the guest's DNS server too, with nothing upstream: every lookup is answered at once
        (cloud-init resolves made-up names to detect DNS hijacking before its crawl).

        AWS hands out a router and no route to 169.254.169.254 (the datapath takes the packet
        whatever its next hop); Neutron's DHCP hands out the on-link route (flavors.py says why
        EC2 guests get the router).
        """
        out = self.out.resolve()
        # A run again into the same directory has a new MAC: a lease left for the last one would make
        # dnsmasq refuse the fixed address ("leased to ...") and the guest would get none.
        (out / "dnsmasq.leases").unlink(missing_ok=True)
        args = ["ip", "netns", "exec", self.names.dhcp_netns, "dnsmasq", "--keep-in-foreground",
                "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--interface=eth0", "--bind-interfaces",
                "--pid-file=",
                "--user=root", f"--dhcp-leasefile={out / 'dnsmasq.leases'}", "--log-dhcp",
                f"--log-facility={out / 'dnsmasq.log'}", *route.dnsmasq_args(guest.mac)]
        process = self.dnsmasq = self.cleanup.process("dnsmasq", spawn(args, out / "dnsmasq.out"))
        if process.poll() is not None:
            raise LabError(f"dnsmasq exited {process.returncode}: {_text(out / 'dnsmasq.out')[-1000:]}")

    def _agent(self, switch: Switch, upstream: str, secret_file: Path, next_hops: tuple[str, ...]) -> None:
        """``imds agent`` for this switch; its metadata bridge and namespace are undone by name after it stops."""
        names, out = self.names, self.out
        ensure_system_user(HAPROXY_USER, "imds agent haproxy workers")
        state = (out / "agent").resolve()
        state.mkdir(exist_ok=True)
        self.cleanup.command("ip", "netns", "del", names.meta_netns)
        self.cleanup.add(f"del-br {names.meta_bridge}",
                         lambda: switch.vsctl("--if-exists", "del-br", names.meta_bridge))
        self.cleanup.add("stop a haproxy the agent left", lambda: _stop_leftover_haproxy(state / "haproxy-master.sock"))
        imds = Path(sys.executable).parent / "imds"
        env = {k: v for k, v in tool_env().items() if not k.startswith(("IMDS_", "OVS_"))}
        args = [*names.host.enter, str(imds) if imds.exists() else "imds", "agent",
                "--ovsdb", f"unix:{switch.db_sock}",
                "--integration-bridge", names.bridge, "--metadata-bridge", names.meta_bridge,
                "--meta-port", names.meta_port, "--meta-netns", names.meta_netns,
                "--upstream", self._relayed(upstream),
                "--shared-secret-file", str(secret_file.resolve()), "--state-dir", str(state),
                "--check-interval", "0.5", *(arg for hop in next_hops for arg in ("--metadata-next-hop", hop))]
        log = out / "agent.log"
        agent = spawn(args, log, env=env)
        self.cleanup.add(f"stop imds agent (pid {agent.pid})", lambda: stop(agent, timeout=20.0))

        def serving() -> bool:
            if agent.poll() is not None:
                raise LabError(f"imds agent exited {agent.returncode}:\n{_text(log)[-2000:]}")
            return "agent.haproxy_applied" in _text(log)

        wait_until("imds agent and its haproxy", serving, READY_TIMEOUT)


    def _relayed(self, upstream: str) -> str:
        """``upstream`` as the agent reaches it from the run's namespace: through a relay on its loopback."""
        parts = urlsplit(upstream)
        if parts.hostname is None:
            raise LabError(f"the agent's upstream {upstream!r} names no host")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        inside = relay(self.cleanup, self.names.host, (parts.hostname, port))
        return f"{parts.scheme}://127.0.0.1:{inside.port}"


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _stop_leftover_haproxy(master: Path) -> None:
    """If the agent died without stopping haproxy, stop its master by the PID it reports."""
    if not master.exists():
        return
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5.0)
            sock.connect(str(master))
            sock.sendall(b"show proc\n")
            sock.shutdown(socket.SHUT_WR)
            text = sock.recv(65536).decode(errors="replace")
    except OSError:
        return  # nobody listens: haproxy is gone
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[1] == "master" and fields[0].isdigit():
            os.kill(int(fields[0]), signal.SIGTERM)
