"""The lab's guest network, pure parts: IPv6-only and the three routes to 169.254.169.254.

The real boots are in bench/lab_matrix.py; these pin what each one is told: dnsmasq's DHCP and
router advertisements per route, the guest's IPv6 addresses in its record, the seed URL a
NoCloud guest gets without IPv4, and which flavors the lab refuses without IPv4 (and why).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from imds.errors import LabError
from imds.lab import datapath
from imds.lab.boot import Guest, Options, addresses, boot, refusal
from imds.lab.flavors import FLAVORS, ROUTES, flavor
from imds.lab.image import Image

MAC = "52:54:00:39:35:6e"


def test_slaac_address_is_the_modified_eui64_of_the_mac():
    """The address the guest's kernel forms from the lab's /64 (checked against a real guest's console)."""
    assert datapath.slaac_address(MAC) == "fd00:231::5054:ff:fe39:356e"
    assert datapath.slaac_address("02:00:00:00:00:01") == "fd00:231::ff:fe00:1"


def test_each_route_is_what_dhcp_hands_out():
    """Routes onlink and dhcp are option 121 (on-link, via the DHCP port); gateway only a default route."""
    base = [f"--dhcp-range={datapath.GUEST_IP},static,255.255.255.0,1h", f"--dhcp-host={MAC},{datapath.GUEST_IP}"]
    assert datapath.Route("onlink").dnsmasq_args(MAC) == [*base, "--dhcp-option=121,169.254.169.254/32,0.0.0.0"]
    assert datapath.Route("dhcp").dnsmasq_args(MAC) == [
        *base, f"--dhcp-option=121,169.254.169.254/32,{datapath.DHCP_SERVER}"]
    assert datapath.Route("gateway").dnsmasq_args(MAC) == [*base, f"--dhcp-option=3,{datapath.GATEWAY}"]
    assert datapath.GATEWAY != datapath.DHCP_SERVER  # the router is its own namespace, not the DHCP port
    assert [datapath.Route(r).router for r in ROUTES] == [False, False, True]
    with pytest.raises(LabError, match="unknown route 'nat'"):
        datapath.Route("nat").dnsmasq_args(MAC)


def test_ipv6_only_has_no_dhcpv4_but_router_advertisements_and_dhcpv6():
    """No IPv4 range at all; RA with a router lifetime (the guest's default route) and one DHCPv6 address."""
    route = datapath.Route("gateway", ipv6_only=True)
    args = route.dnsmasq_args(MAC)
    assert "--enable-ra" in args
    assert f"--ra-param=eth0,10,{datapath.RA_LIFETIME}" in args
    assert f"--dhcp-range={datapath.GUEST_IP6},{datapath.GUEST_IP6},slaac,64,1h" in args
    assert not any(datapath.GUEST_IP in arg or "dhcp-option" in arg for arg in args)
    assert not route.router
    assert route.name == "ipv6-router"


def test_ipv6_only_record_carries_the_guests_ipv6_addresses():
    """The record names the SLAAC and DHCPv6 addresses and no IPv4."""
    guest = Guest("ec2c1a5e-0000-4000-8000-000000000001", MAC, "ssh-ed25519 AAAA lab")
    assert addresses(guest, ipv6_only=True) == ["fd00:231::5054:ff:fe39:356e", datapath.GUEST_IP6]
    assert addresses(guest, ipv6_only=False) == [datapath.GUEST_IP]


def test_nocloud_seed_names_the_ipv6_metadata_address_without_ipv4():
    """NoCloud's seed URL (command line and SMBIOS serial) is AWS's IPv6 address when there is no IPv4."""
    nocloud = flavor("nocloud")
    assert nocloud.kernel_args("cmdline", ipv6=True) == ["ci.ds=NoCloud",
                                                         "ds=nocloud-net;s=http://[fd00:ec2::254]/nocloud/"]
    assert nocloud.smbios_arg("smbios", "u", ipv6=True) == (
        "type=1,serial=ds=nocloud-net;s=http://[fd00:ec2::254]/nocloud/,uuid=u")
    assert flavor("ec2").kernel_args("cmdline", ipv6=True) == ["ci.ds=Ec2"]


def _options(tmp_path: Path, name: str, **extra: object) -> Options:
    return Options(name, tmp_path / "run", "lab-guest", Image(tmp_path / "disk"), **extra)  # type: ignore[arg-type]


def test_flavors_without_ipv6_metadata_are_refused_before_anything_runs(tmp_path):
    """OpenStack (cloud-init 22.4 has no IPv6 metadata address for it) is refused naming the flavor and why."""
    refused = {name for name in FLAVORS if refusal(_options(tmp_path, name, ipv6_only=True))}
    assert refused == {"openstack"}
    reason = refusal(_options(tmp_path, "openstack", ipv6_only=True))
    assert reason is not None
    assert "flavor openstack" in reason
    assert "169.254.169.254" in reason
    assert refusal(_options(tmp_path, "openstack")) is None
    assert refusal(_options(tmp_path, "ec2", ipv6_only=True, route="dhcp")) is not None
    with pytest.raises(LabError, match="flavor openstack"):
        boot(_options(tmp_path, "openstack", ipv6_only=True), print)
    assert not (tmp_path / "run").exists()  # nothing was made: no run directory, no result


class _Running:
    """A dnsmasq that is running, as far as the step can tell (never stopped: the cleanup is not closed)."""

    returncode = None
    pid = 0

    def poll(self) -> None:
        return None


def test_dnsmasq_starts_without_the_last_runs_leases(tmp_path, monkeypatch):
    """A second run into the same directory (a new MAC) must not find the fixed address leased to the first."""
    leases = tmp_path / "dnsmasq.leases"
    leases.write_text("1764221433 52:54:00:75:57:b9 10.231.0.10 lab-image 01:52:54:00:75:57:b9\n")
    started: list[list[str]] = []

    def spawn(args: list[str], _log: Path) -> _Running:
        started.append(args)
        assert not leases.exists()
        return _Running()

    monkeypatch.setattr(datapath, "spawn", spawn)
    cleanup = datapath.Cleanup()
    path = datapath.Datapath(cleanup, tmp_path, datapath.Names("t001"))
    path._dnsmasq(datapath.Guest("u", MAC, "lvmt001"), datapath.Route("onlink"))
    assert started
    assert f"--dhcp-leasefile={leases}" in started[0]
    assert f"--dhcp-host={MAC},{datapath.GUEST_IP}" in started[0]


def test_dhcp_gone_needs_the_dhcp_route_and_gives_the_agent_the_dhcp_ports_address(tmp_path):
    """--dhcp-gone only with --route dhcp over IPv4; the agent then answers ARP for the DHCP port's address."""
    assert refusal(_options(tmp_path, "openstack", route="dhcp", dhcp_gone=True)) is None
    assert refusal(_options(tmp_path, "openstack", dhcp_gone=True)) is None  # OpenStack's own route is dhcp
    for name, other in (("openstack", {"route": "onlink"}), ("openstack", {"route": "gateway"}), ("ec2", {})):
        assert "--route dhcp" in (refusal(_options(tmp_path, name, dhcp_gone=True, **other)) or "")
    assert datapath.Route("dhcp", dhcp_gone=True).next_hops == (datapath.DHCP_SERVER,)
    assert datapath.Route("dhcp").next_hops == ()
