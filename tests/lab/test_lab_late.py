"""The late read without a VM: the guest's reader script run by ``sh`` here, against a local HTTP server.

The reader is the text the lab ships in the userdata; only the paths a host cannot offer are
swapped (cloud-init's result file, the serial console). It finds its NIC by MAC (the loopback
device's here), reads the URL, and prints ``LAB-LATE ok`` when the answer names the instance,
or the failure with the routes and ``LAB-LATE end``; ``Console`` turns either into the verdict.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from imds.lab import boot as lab_boot
from imds.lab import datapath
from imds.lab.console import Console
from imds.lab.flavors import flavor
from imds.lab.late import CONSOLE, READER, late_script, late_url, reader
from imds.services.render.network import network_data

INSTANCE = "4f1c-lab-late"
LOOPBACK_MAC = "00:00:00:00:00:00"


class Answers(BaseHTTPRequestHandler):
    """GET answers the body it was given (after a token PUT when one is required); PUT answers a token."""

    body = b""
    token_required = False
    seen: list[tuple[str, str, str | None]] = []  # noqa: RUF012 - one test at a time sets it

    def do_PUT(self) -> None:
        self.seen.append(("PUT", self.path, self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")))
        self._reply(b"lab-token")

    def do_GET(self) -> None:
        token = self.headers.get("X-aws-ec2-metadata-token")
        self.seen.append(("GET", self.path, token))
        if self.token_required and token != "lab-token":
            self.send_response(401)
            self.end_headers()
            return
        self._reply(self.body)

    def _reply(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        """Quiet."""


@pytest.fixture
def server() -> Iterator[tuple[str, type[Answers]]]:
    handler = type("Handler", (Answers,), {"seen": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def run_reader(tmp_path: Path, url: str, *, token: bool = False) -> Console:
    """The reader as shipped, with cloud-init's result file and the console swapped for files here."""
    done = tmp_path / "result.json"
    done.write_text("{}")
    serial = tmp_path / "serial.log"
    text = reader(url, INSTANCE, LOOPBACK_MAC, token=token, pause=0)
    text = text.replace("/run/cloud-init/result.json", str(done)).replace("/dev/ttyS0", str(serial))
    script = tmp_path / "late.sh"
    script.write_text(text)
    subprocess.run(["sh", str(script)], check=False, timeout=120, capture_output=True)
    console = Console(serial, "LAB-MARKER", "lab-guest", late=CONSOLE)
    console.poll()
    return console


def test_a_guest_that_reads_its_metadata_late_says_ok(tmp_path, server):
    """The answer names the instance: one ``LAB-LATE ok`` line with the URL, and the boot may pass."""
    url, handler = server
    handler.body = f'{{"uuid": "{INSTANCE}"}}'.encode()
    console = run_reader(tmp_path, f"{url}/openstack/latest/meta_data.json")
    assert console.late_line == f"{CONSOLE} ok {url}/openstack/latest/meta_data.json try 1"
    assert "late read" in console.seen
    assert not console.late_failed


def test_a_guest_cut_off_fails_with_its_routes_on_the_console(tmp_path, server):
    """An answer for someone else (or none): five tries, then the failure, ``ip route`` output and the end line."""
    url, handler = server
    handler.body = b'{"uuid": "another"}'
    console = run_reader(tmp_path, f"{url}/openstack/latest/meta_data.json")
    assert console.late_failed
    assert console.late_reported
    assert console.late_line is not None
    assert console.late_line.startswith(f"{CONSOLE} failed: curl exit 0 reading {url}")
    assert "(NIC lo)" in console.late_line  # found by its MAC
    assert "--- ip route" in console.late_report
    assert "--- ip -6 route" in console.late_report
    assert any("127.0.0.1" in line for line in console.late_report)  # ip addr: lo's address
    assert len(handler.seen) == 5
    assert not console.done("DataSourceOpenStack")


def test_nothing_listening_is_a_failure_with_curls_exit_status(tmp_path):
    """Connection refused: curl's exit 7 is on the failure line."""
    console = run_reader(tmp_path, "http://127.0.0.1:9/openstack/latest/meta_data.json")
    assert console.late_line is not None
    assert "curl exit 7" in console.late_line


def test_an_ec2_guest_asks_a_token_first(tmp_path, server):
    """EC2 with IMDSv2 required: PUT /latest/api/token, then the GET carries it."""
    url, handler = server
    handler.body = INSTANCE.encode()
    handler.token_required = True
    console = run_reader(tmp_path, f"{url}/latest/meta-data/instance-id", token=True)
    assert "late read" in console.seen
    assert handler.seen[0] == ("PUT", "/latest/api/token", "300")
    assert handler.seen[1] == ("GET", "/latest/meta-data/instance-id", "lab-token")


def test_each_flavor_reads_its_own_document_from_the_address_it_has():
    """IPv4 169.254.169.254; IPv6 OpenStack's link-local address (zone: the NIC), else fd00:ec2::254."""
    assert late_url(flavor("ec2"), ipv6=False) == "http://169.254.169.254/latest/meta-data/instance-id"
    assert late_url(flavor("ec2"), ipv6=True) == "http://[fd00:ec2::254]/latest/meta-data/instance-id"
    assert late_url(flavor("openstack"), ipv6=False) == "http://169.254.169.254/openstack/latest/meta_data.json"
    assert late_url(flavor("openstack"), ipv6=True) == "http://[fe80::a9fe:a9fe%25$IFACE]/openstack/latest/meta_data.json"
    assert late_url(flavor("configdrive"), ipv6=True) == "http://[fd00:ec2::254]/openstack/latest/meta_data.json"
    assert late_url(flavor("nocloud"), ipv6=False) == "http://169.254.169.254/nocloud/meta-data"


def test_the_userdata_part_hands_the_reader_to_systemd():
    """The part writes the reader and starts it as a unit of its own (it must outlive cloud-final)."""
    part = late_script(flavor("openstack"), INSTANCE, "52:54:00:AB:CD:EF", ipv6=False)
    assert part.startswith("#!/bin/sh\n")
    assert f"cat > {READER} <<'IMDS_LAB_LATE'\n#!/bin/sh\n" in part
    assert f"systemd-run --no-block --unit=imds-lab-late sh {READER}" in part
    assert '= "52:54:00:ab:cd:ef" ]' in part  # sysfs spells MACs in lower case
    assert INSTANCE in part


@pytest.mark.parametrize(("route", "hop"), [("dhcp", datapath.DHCP_SERVER), ("gateway", datapath.GATEWAY),
                                            ("onlink", "0.0.0.0")])  # noqa: S104 - a route's next hop
def test_the_lab_record_says_the_way_its_dhcp_gave_and_imds_keeps_it(route, hop):
    """Each --route is written into the record; the derived network_data.json carries it as the metadata route."""
    guest = lab_boot.Guest("u-1", "52:54:00:00:00:01", "ssh-ed25519 AAAA imds-lab")
    document = lab_boot._metadata(guest, "lab-guest", datapath.Route(route), dhcp=False)
    (network,) = network_data(document)["networks"]
    assert network["routes"][-1] == {"network": "169.254.169.254", "netmask": "255.255.255.255", "gateway": hop}
    dhcp = lab_boot._metadata(guest, "lab-guest", datapath.Route(route), dhcp=True)
    assert [n["type"] for n in network_data(dhcp)["networks"]] == ["ipv4_dhcp"]


def test_an_ipv6_only_record_routes_the_ipv6_metadata_address_via_the_router():
    """IPv6-only: two static addresses, fd00:ec2::254 via dnsmasq's address (the advertised router), once."""
    guest = lab_boot.Guest("u-1", "52:54:00:00:00:01", "ssh-ed25519 AAAA imds-lab")
    document = lab_boot._metadata(guest, "lab-guest", datapath.Route("gateway", ipv6_only=True), dhcp=False)
    networks = network_data(document)["networks"]
    assert [n["type"] for n in networks] == ["ipv6", "ipv6"]
    assert networks[0]["routes"] == [{"network": "fd00:ec2::254", "netmask": "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
                                      "gateway": datapath.DHCP_SERVER6}]
    assert networks[1]["routes"] == []
