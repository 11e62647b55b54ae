"""The lab's datapath in a network namespace of its own (``imds.lab.hostns``), without a VM.

A lab boot used to run its userspace switch in the host's namespace, where every such switch
opens the same ``ovs-netdev`` tap: a boot beside an OVS test waited for it. These build the
lab's real datapath (its switch, dnsmasq, ``imds agent`` and haproxy) for a record on the lab's
own ``imds serve`` and check that all of it lives in the run's namespace, that a VM stand-in
plugged into it as another port of the instance reads its record through the agent and the
relay, and that nothing is left afterwards. The relay is also checked alone.
"""

from __future__ import annotations

import http.server
import json
import secrets
import subprocess
import threading
import uuid as uuidlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from helpers import wait_for
from imds.lab import datapath
from imds.lab.hostns import HostNs, relay
from imds.lab.run import Cleanup, cleaned_up, sh
from imds.lab.server import own_server
from imds.lab.switch import Switch
from imds.lab.userdata import lab_userdata

pytestmark = pytest.mark.timeout(300)

VM_IP = "10.231.0.20/24"
VM_MAC = "52:54:00:7e:57:01"


def _netns() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


def _links(*where: str) -> str:
    return sh("ip", *where, "-o", "link")


class _Peer(http.server.BaseHTTPRequestHandler):
    """Answers every GET with the peer address and the path it saw."""

    def do_GET(self) -> None:
        body = json.dumps({"peer": self.client_address[0], "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        return


@contextmanager
def _peer() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Peer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def _curl_in(netns: str, url: str, timeout: float = 10.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", netns, "curl", "-sS", "-g", "--max-time", str(timeout), url],
                          capture_output=True, text=True, timeout=timeout + 20, check=False)


def test_the_relay_carries_a_connection_out_of_the_namespace_and_stops_with_the_run():
    """From the namespace's loopback to a server here, which sees 127.0.0.1; the caller's thread stays here."""
    before = Path("/proc/thread-self/ns/net").readlink()
    namespace = HostNs(f"imdslabt-{secrets.token_hex(2)}")
    with _peer() as port:
        cleanup = Cleanup()
        try:
            namespace.create(cleanup)
            inside = relay(cleanup, namespace, ("127.0.0.1", port))
            assert Path("/proc/thread-self/ns/net").readlink() == before
            assert f"127.0.0.1:{inside.port} " in sh(*namespace.exec, "ss", "-Hltn")
            answers = [_curl_in(namespace.name, f"http://127.0.0.1:{inside.port}/try-{n}") for n in range(3)]
            for n, answer in enumerate(answers):
                assert answer.returncode == 0, answer.stderr
                assert json.loads(answer.stdout) == {"peer": "127.0.0.1", "path": f"/try-{n}"}
            inside.close()
            assert _curl_in(namespace.name, f"http://127.0.0.1:{inside.port}/after", timeout=3.0).returncode != 0
        finally:
            cleanup.close()
    assert not cleanup.failures
    assert namespace.name not in _netns()


def _vm(names: datapath.Names, switch: Switch, cleanup: Cleanup, instance: str) -> str:
    """A VM stand-in: a namespace whose eth0 is a veth into the run's namespace, plugged as os-vif plugs a port."""
    vm, port = f"imdslabt-vm-{names.tag}", f"lvt{names.tag}"
    cleanup.command("ip", "netns", "del", vm)
    sh("ip", "netns", "add", vm)
    sh(*names.host.ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", vm))
    for args in (("link", "set", "lo", "up"), ("link", "set", "eth0", "address", VM_MAC),
                 ("addr", "add", VM_IP, "dev", "eth0"), ("link", "set", "eth0", "up"),
                 ("route", "add", "169.254.169.254/32", "dev", "eth0")):
        sh("ip", "-n", vm, *args)
    sh("ip", "netns", "exec", vm, "ethtool", "-K", "eth0", "tx", "off")  # veth into the userspace datapath
    sh(*names.host.ip("link", "set", port, "up"))
    cleanup.add(f"del-port {port}", lambda: switch.vsctl("--if-exists", "del-port", names.bridge, port))
    switch.vsctl("add-port", names.bridge, port, f"tag={datapath.VLAN}", "--", "set", "Interface", port,
                 f"external_ids:iface-id={uuidlib.uuid4()}", f"external_ids:attached-mac={VM_MAC}",
                 f"external_ids:vm-uuid={instance}", "external_ids:iface-status=active")
    return vm


def test_the_datapath_lives_in_the_runs_namespace_and_serves_the_instance_through_it(tmp_path):
    """Switch, taps and veths in imdslab-host-TAG (none in ours); a port of the instance reads its own record."""
    out = tmp_path / "run"
    out.mkdir()
    secret = out / "shared-secret"
    secret.write_text(secrets.token_hex(32))
    instance = str(uuidlib.uuid4())
    names = datapath.Names(secrets.token_hex(2))
    with cleaned_up() as cleanup:
        server = own_server(cleanup, out, secret, "optional")
        server.push(instance, [VM_IP.split("/", maxsplit=1)[0]], {"id": instance, "hostname": "lab-hostns"},
                    lab_userdata(None, "LAB-MARKER", [], []))
        network = datapath.Datapath(cleanup, out, names)
        switch = network.build(datapath.Guest(instance, "52:54:00:7e:57:00", names.tap), server.url, secret,
                               datapath.Route("onlink"))
        ours, theirs = _links(), _links("-n", names.host.name)
        for made in (names.tap, names.dhcp_port, "ovs-netdev"):
            assert f" {made}" in theirs
        for made in (names.tap, names.dhcp_port, names.meta_port):
            assert f" {made}" not in ours
        vm = _vm(names, switch, cleanup, instance)

        def read() -> dict[str, object] | None:
            answer = _curl_in(vm, "http://169.254.169.254/openstack/latest/meta_data.json", timeout=5.0)
            return json.loads(answer.stdout) if answer.returncode == 0 and answer.stdout.startswith("{") else None

        found = wait_for(read, what="the VM stand-in's read through the agent", timeout=120.0,
                         explain=lambda: (out / "agent.log").read_text(errors="replace")[-3000:])
        assert found["uuid"] == instance
        assert found["hostname"] == "lab-hostns"
        reads = server.reads(0.0)
        assert any(entry["path"] == "/openstack/latest/meta_data.json" and entry["status"] == 200 for entry in reads)
    assert not cleanup.failures
    assert names.host.name not in _netns()
    assert names.meta_netns not in _netns()
    assert f"imdslabt-vm-{names.tag}" not in _netns()
