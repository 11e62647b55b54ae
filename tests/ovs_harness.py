"""Userspace Open vSwitch and network-namespace VMs for the host-datapath tests.

``ovs_daemons(tmp)`` starts ``ovsdb-server`` and ``ovs-vswitchd --disable-system`` from a
temporary directory as children of the test (never ``--detach``: detached daemons are reaped
slowly) and stops them by PID. ``Vm`` is a network namespace on a veth pair whose host end is
plugged into the integration bridge the way libvirt/Nova do it (``external_ids:vm-uuid`` and
``attached-mac``, the Port ``tag`` as local VLAN). Every name carries a per-run tag so two
runs never collide, and everything is removed by name or PID even when a test fails.

Nothing here ever sends to 169.254.169.254 from the root namespace: only ``Vm.curl`` does,
from inside the VM's namespace.
"""

from __future__ import annotations

import http.server
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import haproxy_user
from helpers import wait_for

STOP_TIMEOUT = 10.0
READY_TIMEOUT = 60.0  # generous: a loaded 2-core CI machine restarts OVS slowly
OTHER_SWITCH_TIMEOUT = 240.0  # a lab boot holds the host's ovs-netdev for minutes; within pytest's 300 s per test
TOOLS = ("ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl", "ovsdb-tool", "haproxy", "ethtool", "ip", "curl")


def require_tools() -> None:
    """Fail (never skip) when a program these tests drive is missing; make the agent's haproxy user."""
    search = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    missing = [tool for tool in TOOLS if shutil.which(tool, path=search) is None]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: scripts/test installs openvswitch-switch, haproxy, ethtool")
    haproxy_user.ensure()


def run_tag() -> str:
    """Four hex digits unique to this run, for interface, bridge and namespace names (15-char limit)."""
    return secrets.token_hex(2)


def sh(*args: str, env: dict[str, str] | None = None, check: bool = True, timeout: float = 30.0) -> str:
    """Run a command to completion (bounded); its stdout, or a test failure with stderr."""
    result = subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")
    return result.stdout


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM by PID, bounded; SIGKILL when it does not exit."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT)


@dataclass
class Ovs:
    """One private Open vSwitch: its directory, database socket and daemons.

    ``netns``: the network namespace the daemons run in (None: the host's). In a namespace of
    its own the switch has its own ``ovs-netdev`` tap and its own internal ports, so it never
    waits for, or disturbs, another userspace switch on the host.
    """

    root: Path
    tag: str
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    netns: str | None = None

    @property
    def env(self) -> dict[str, str]:
        """The environment every OVS tool needs to find this instance's files."""
        env = dict(os.environ)
        for name in ("RUNDIR", "DBDIR", "LOGDIR", "SYSCONFDIR"):
            env[f"OVS_{name}"] = str(self.root)
        return env

    @property
    def db_sock(self) -> Path:
        """The ovsdb-server socket (``--ovsdb unix:PATH``)."""
        return self.root / "db.sock"

    def vsctl(self, *args: str, check: bool = True) -> str:
        """``ovs-vsctl`` against this database (stdout)."""
        return sh("ovs-vsctl", f"--db=unix:{self.db_sock}", "--timeout=10", *args, env=self.env, check=check)

    def remove(self, *bridges: str, netns: str) -> None:
        """Best-effort clean-up: delete ``bridges`` (if they exist) and the network namespace ``netns``."""
        for bridge in bridges:
            self.vsctl("--if-exists", "del-br", bridge, check=False)
        sh("ip", "netns", "del", netns, check=False)

    def ofctl(self, *args: str, check: bool = True) -> str:
        """``ovs-ofctl`` against this switch (stdout)."""
        return sh("ovs-ofctl", *args, env=self.env, check=check)

    def _spawn(self, name: str, *args: str) -> None:
        log = (self.root / f"{name}.out").open("wb")
        where = ["ip", "netns", "exec", self.netns] if self.netns else []  # it execs: the PID stays the daemon's
        with log:
            self.processes[name] = subprocess.Popen(
                [*where, name, *args], env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )

    def start_db(self) -> None:
        """Create the database and start ovsdb-server; wait until it answers."""
        db = self.root / "conf.db"
        sh("ovsdb-tool", "create", str(db), "/usr/share/openvswitch/vswitch.ovsschema")
        self._spawn("ovsdb-server", str(db), f"--remote=punix:{self.db_sock}", "--pidfile", "--log-file")
        wait_for(self.db_sock.exists, what="ovsdb-server", timeout=READY_TIMEOUT)
        self.vsctl("--no-wait", "init")

    def start_switch(self) -> None:
        """Start ovs-vswitchd (userspace only) and wait until it has configured the database."""
        self._spawn("ovs-vswitchd", f"unix:{self.db_sock}", "--disable-system", "--pidfile", "--log-file")
        wait_for(self._switch_ready, what="ovs-vswitchd", timeout=READY_TIMEOUT)

    def _switch_ready(self) -> bool:
        process = self.processes["ovs-vswitchd"]
        if process.poll() is not None:
            pytest.fail(f"ovs-vswitchd exited {process.returncode}: {self.log('ovs-vswitchd')}")
        # A write without --no-wait bumps next_cfg and returns once ovs-vswitchd has applied it.
        result = subprocess.run(
            ["ovs-vsctl", f"--db=unix:{self.db_sock}", "--timeout=2", "set", "Open_vSwitch", ".",
             "external_ids:harness=ready"],
            env=self.env, capture_output=True, check=False, timeout=10,
        )
        return result.returncode == 0

    def stop_switch(self) -> None:
        """Stop ovs-vswitchd by PID (flows are lost, the database stays)."""
        stop_process(self.processes.pop("ovs-vswitchd"))

    def restart_switch(self) -> None:
        """Stop and start ovs-vswitchd, as an upgrade or a crash would."""
        self.stop_switch()
        self.start_switch()

    def log(self, name: str) -> str:
        """What daemon ``name`` wrote."""
        path = self.root / f"{name}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def add_bridge(self, name: str) -> None:
        """A userspace bridge that drops what no flow handles (like Neutron's br-int)."""
        self.vsctl("add-br", name, "--", "set", "Bridge", name, "datapath_type=netdev", "fail_mode=secure")

    def ofport(self, interface: str) -> int:
        """The OpenFlow port number OVS gave ``interface`` (waits until it has one)."""
        found: list[int] = []

        def assigned() -> bool:
            text = self.vsctl("get", "Interface", interface, "ofport", check=False).strip()
            if text.lstrip("-").isdigit() and int(text) > 0:
                found.append(int(text))
                return True
            return False

        wait_for(assigned, what=f"an ofport for {interface}", timeout=READY_TIMEOUT)
        return found[0]

    def flows(self, bridge: str, *match: str) -> list[str]:
        """The bridge's flows (optionally filtered, e.g. ``cookie=0x1/-1``), one per line, stats stripped."""
        lines = self.ofctl("--no-stats", "dump-flows", bridge, *match).splitlines()
        return [line.strip() for line in lines if line.strip() and "NXST_FLOW" not in line and "OFPST_FLOW" not in line]

    def stop(self) -> None:
        """Stop both daemons by PID (switch first)."""
        for name in ("ovs-vswitchd", "ovsdb-server"):
            process = self.processes.pop(name, None)
            if process is not None:
                stop_process(process)


@contextmanager
def ovs_daemons(root: Path, *, own_netns: bool = False) -> Iterator[Ovs]:
    """A private userspace OVS under ``root`` (short path: unix sockets are limited to 108 bytes).

    ``own_netns``: run the daemons in a namespace made for this run (``Ovs.netns``), removed after.
    """
    require_tools()
    tag = run_tag()
    netns = f"ovshost{tag}" if own_netns else None
    ovs = Ovs(root, tag, netns=netns)
    try:
        if netns:
            sh("ip", "netns", "add", netns)
            netns_exec(netns, "ip", "link", "set", "lo", "up")
        else:
            # The userspace datapath of every ovs-vswitchd in one namespace is one tap, "ovs-netdev":
            # while another switch holds it (a lab boot, another run) this one gets no port numbers.
            wait_for(lambda: not Path("/sys/class/net/ovs-netdev").exists(), timeout=OTHER_SWITCH_TIMEOUT,
                     what="the host's other userspace Open vSwitch to stop (it holds the ovs-netdev tap)")
        ovs.start_db()
        ovs.start_switch()
        yield ovs
    finally:
        ovs.stop()
        if netns:
            sh("ip", "netns", "del", netns, check=False)


def netns_exec(netns: str, *args: str, check: bool = True, timeout: float = 30.0) -> str:
    """Run a command inside a network namespace (stdout)."""
    return sh("ip", "netns", "exec", netns, *args, check=check, timeout=timeout)


@dataclass
class Vm:
    """A VM stand-in: a namespace whose ``eth0`` is a veth plugged into the integration bridge."""

    ovs: Ovs
    bridge: str
    name: str  # namespace name, also the suffix of the host-side veth
    uuid: str
    mac: str
    ip: str  # with prefix, e.g. 10.0.0.5/24
    tag: int = 0
    tenant: str | None = None

    @property
    def port(self) -> str:
        """The host-side veth (the OVS port)."""
        return f"v{self.name}"[:15]

    def _host_ip(self, *args: str, check: bool = True) -> str:
        """``ip`` on the switch's side: the host's namespace, or the switch's own (``Ovs.netns``)."""
        where = ("-n", self.ovs.netns) if self.ovs.netns else ()
        return sh("ip", *where, *args, check=check)

    def create(self) -> None:
        """Namespace, veth pair, addresses, offload off, then the OVS port with Nova's external_ids."""
        sh("ip", "netns", "add", self.name)
        # No duplicate address detection: the link-local address is usable at once.
        netns_exec(self.name, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0")
        self._host_ip("link", "add", self.port, "type", "veth", "peer", "name", "eth0", "netns", self.name)
        netns_exec(self.name, "ip", "link", "set", "lo", "up")
        netns_exec(self.name, "ip", "link", "set", "eth0", "address", self.mac)
        netns_exec(self.name, "ip", "addr", "add", self.ip, "dev", "eth0")
        netns_exec(self.name, "ip", "link", "set", "eth0", "up")
        # The metadata address is on-link, as a cloud's DHCP route for 169.254.169.254 makes it.
        netns_exec(self.name, "ip", "route", "add", "169.254.169.254/32", "dev", "eth0")
        # veth + the userspace datapath: TCP fails silently with checksum offload on.
        netns_exec(self.name, "ethtool", "-K", "eth0", "tx", "off")
        self._host_ip("link", "set", self.port, "up")
        self.plug()

    def plug(self) -> None:
        """Add the host-side veth to the bridge as os-vif does (its four external_ids), with its tag.

        A ``tenant`` adds ``external_ids:tenant-id``, which neither Nova, os-vif nor Neutron
        writes (docs/hypervisor.md): only for the tests of a plugging side that does.
        """
        ids = [f"external_ids:iface-id=port-{self.uuid[:8]}-{self.port}", "external_ids:iface-status=active",
               f"external_ids:attached-mac={self.mac}", f"external_ids:vm-uuid={self.uuid}"]
        if self.tenant:
            ids.append(f"external_ids:tenant-id={self.tenant}")
        tag = [f"tag={self.tag}"] if self.tag else []
        self.ovs.vsctl("add-port", self.bridge, self.port, *tag, "--", "set", "Interface", self.port, *ids)

    def unplug(self) -> None:
        """Remove the OVS port (the VM is gone from the hypervisor's point of view)."""
        self.ovs.vsctl("--if-exists", "del-port", self.bridge, self.port)

    def curl(self, url: str, *args: str, timeout: float = 8.0) -> subprocess.CompletedProcess[str]:
        """``curl`` from inside the VM: status code on the last line after the body."""
        command = ["ip", "netns", "exec", self.name, "curl", "-sS", "-g", "--max-time", str(timeout),
                   "-w", "\n%{http_code}", *args, url]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout + 10, check=False)

    def get(self, url: str, *args: str, timeout: float = 8.0) -> tuple[int, str]:
        """(status, body) of a GET from inside the VM; status 0 when no answer came."""
        result = self.curl(url, *args, timeout=timeout)
        body, _, code = result.stdout.rpartition("\n")
        return (int(code) if code.isdigit() else 0), body

    def destroy(self) -> None:
        """Unplug, then delete the veth and the namespace (each step tolerant of a partial create)."""
        with suppress(BaseException):
            self.unplug()
        self._host_ip("link", "del", self.port, check=False)
        sh("ip", "netns", "del", self.name, check=False)


@contextmanager
def vms(*machines: Vm) -> Iterator[tuple[Vm, ...]]:
    """Create the VMs; destroy every one afterwards, even after a failure halfway."""
    created: list[Vm] = []
    try:
        for vm in machines:
            created.append(vm)
            vm.create()
        yield machines
    finally:
        for vm in created:
            vm.destroy()


@dataclass
class AgentProcess:
    """``imds agent`` run as a child with this OVS's environment; stopped by PID."""

    ovs: Ovs
    args: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start (or start again) with the same arguments; output appended to ``log``.

        It runs where the switch runs (``Ovs.netns``): that namespace is its host. It enters it
        with ``nsenter --net`` (not ``ip netns exec``, which also gives it a mount namespace of
        its own), so a ``--meta-netns`` it creates is one the test sees too.
        """
        imds = Path(sys.executable).parent / "imds"
        # No OVS_* variables either: the agent must find everything from --ovsdb, as on a host
        # where OVS runs from its own directory.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("IMDS_", "OVS_"))}
        where = ["nsenter", f"--net=/run/netns/{self.ovs.netns}"] if self.ovs.netns else []
        with self.log.open("ab") as sink:
            self.process = subprocess.Popen(
                [*where, str(imds), "agent", *self.args], env=env, stdin=subprocess.DEVNULL, stdout=sink,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        """Everything the agent logged so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        """Whether the process is running."""
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM by PID (the agent stops its haproxy), bounded."""
        if self.process is not None:
            stop_process(self.process)
            self.process = None


class _Echo(http.server.BaseHTTPRequestHandler):
    """Answers every GET with the request's path and headers as JSON (what haproxy forwarded)."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = json.dumps({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


class _NoDelayServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """Haproxy closing an idle keep-alive connection is not an error worth a traceback."""

    def server_bind(self) -> None:
        # Without it keep-alive answers behind haproxy stall on Nagle + delayed ACK.
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().server_bind()


@contextmanager
def echo_upstream() -> Iterator[str]:
    """An HTTP server on a free loopback port echoing the headers it received; yields its URL."""
    server = _NoDelayServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


_PEER_ECHO = """
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        headers = {k.lower(): v for k, v in self.headers.items()}
        body = json.dumps({"peer": self.client_address[0], "path": self.path, "headers": headers}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), H).serve_forever()
"""


@contextmanager
def peer_echo(netns: str, host: str, port: int) -> Iterator[None]:
    """Inside ``netns``, an HTTP server on host:port answering {"peer", "path", "headers"}; stopped by PID."""
    process = subprocess.Popen(
        ["ip", "netns", "exec", netns, sys.executable, "-c", _PEER_ECHO, host, str(port)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _listening(netns, port), what=f"peer echo on {host}:{port}", timeout=READY_TIMEOUT)
        yield
    finally:
        stop_process(process)


def _listening(netns: str, port: int) -> bool:
    return f":{port} " in netns_exec(netns, "ss", "-Hltn", check=False)
