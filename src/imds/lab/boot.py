"""One real boot: record, datapath, QEMU, the console watched until cloud-init is done; result.json.

The guest passes when cloud-init finished with the flavor's datasource, the userdata's marker
(the operator's ``--userdata`` gets the lab's marker part beside it: ``imds.lab.userdata``)
reached the console and the console names the hostname from the record (the marker line
``LAB-MARKER host=NAME``, or getty's ``NAME login:``). result.json says which datasource was
chosen, the accelerator, the seconds from power-on to the first metadata request and to
cloud-init's final stage, and the requests the guest made; it is written on every exit path.
With ``--ganeti-install`` the guest also installs an OS image onto a second disk through the
Ganeti paths, and passes only if that worked too (``imds.lab.ganeti``; result.json's
``ganeti_install``). With ``--systemd-imds`` systemd's own client in the guest must have read
every key it knows from imds (``imds.lab.systemd_imds``; result.json's ``systemd_imds``).
"""

from __future__ import annotations

import json
import secrets
import sys
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from imds.errors import LabError
from imds.lab import datapath, devices, hotplug
from imds.lab.console import Console
from imds.lab.dhcpgone import DhcpGone
from imds.lab.flavors import METADATA_URL, METADATA_URL6, Flavor, flavor
from imds.lab.ganeti import CONSOLE, SCRIPT, Install, Installing, fresh_disk, guest_script, guest_zipapp
from imds.lab.image import Image
from imds.lab.late import CONSOLE as LATE
from imds.lab.late import SCRIPT as LATE_SCRIPT
from imds.lab.late import late_script
from imds.lab.qemu import Machine, Qemu, accelerators
from imds.lab.run import Cleanup, cleaned_up, sh, write_private
from imds.lab.server import Server, own_server, remote_server
from imds.lab.systemd_imds import BIOS_VENDOR, KERNEL_ARGS, public_addresses
from imds.lab.systemd_imds import SCRIPT as SYSTEMD_SCRIPT
from imds.lab.systemd_imds import guest_script as systemd_script
from imds.lab.systemd_imds import verdict as systemd_verdict
from imds.lab.userdata import MARKER, lab_userdata

OLD_CLOUD_INIT = ("bookworm",)  # suites whose cloud-init (22.4) has no IPv6 metadata address for OpenStack


@dataclass
class Options:
    """What ``imds lab boot`` was asked."""

    flavor: str
    out: Path
    hostname: str
    image: Image
    userdata: bytes | None = None
    marker: str = MARKER
    timeout: float = 600.0
    accel: str = "auto"
    identify: str = "cmdline"
    url: str | None = None
    admin_token: str | None = None
    secret_file: Path | None = None  # with --url: the secret that server trusts 127.0.0.1 with
    imdsv2: str = "required"
    ipv6_only: bool = False  # no IPv4 in the guest: router advertisements and DHCPv6 only
    route: str | None = None  # onlink, dhcp or gateway (None: the flavor's own)
    ganeti_install: bool = False  # the guest installs an OS image onto a second disk through the Ganeti paths
    suite: str = "bookworm"  # the Debian suite of the built image (what its cloud-init can do)
    network_data: str = "static"  # what the record says of the subnet: static (with the way to metadata) or dhcp
    device_tags: bool = False  # a tagged NIC and disk; the guest applies the tags with imds-guest udev
    hotplug: bool = False  # after the boot: a NIC and a disk attached to the running guest, then detached
    dhcp_gone: bool = False  # --route dhcp: the DHCP port is removed after the lease (imds.lab.dhcpgone)
    systemd_imds: bool = False  # systemd-imds in the guest must read every key it knows (EC2's SMBIOS)


@dataclass
class Guest:
    """The instance the run made up."""

    uuid: str
    mac: str
    key: str  # the OpenSSH public key in its record


def _guest(chosen: Flavor, out: Path) -> Guest:
    uuid = str(uuidlib.uuid4())
    uuid = chosen.uuid_prefix + uuid[len(chosen.uuid_prefix):]
    mac = "52:54:00:" + ":".join(f"{b:02x}" for b in secrets.token_bytes(3))
    private = Ed25519PrivateKey.generate()
    write_private(out / "id_ed25519", private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    public = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    key = f"{public.decode()} imds-lab"
    (out / "id_ed25519.pub").write_text(key + "\n")
    return Guest(uuid, mac, key)


def addresses(guest: Guest, *, ipv6_only: bool) -> list[str]:
    """The guest's addresses, for its record: IPv4 from DHCP; IPv6-only its SLAAC and DHCPv6 addresses."""
    if ipv6_only:
        return [datapath.slaac_address(guest.mac), datapath.GUEST_IP6]
    return [datapath.GUEST_IP]


@dataclass
class Probe:
    """--systemd-imds: what systemd-imds must read (key → value; the userdata by its bytes)."""

    expected: dict[str, str]
    userdata: bytes


def _metadata(guest: Guest, hostname: str, route: datapath.Route, *, dhcp: bool, nic: str = "eth0") -> dict[str, Any]:
    """The record: its addresses say how the guest reached metadata at boot, which the derived networks keep.

    ``dhcp``: the subnet has DHCP (imds derives ``ipv4_dhcp``/``ipv6_dhcp``, as Nova); otherwise each
    address is static with the way ``route`` set up: on-link, via the DHCP port, or via the gateway
    (IPv6-only: via dnsmasq's address, the advertised router's). ``nic`` names the NIC (cloud-init
    renames it so when the guest's kernel named it otherwise).
    """
    if route.ipv6_only:
        network = datapath.NETWORK6
        listed = [{"address": address, "network": str(network.network_address), "cidr": network.prefixlen,
                   "address_family": 6, "public": False} for address in addresses(guest, ipv6_only=True)]
        way: dict[str, Any] = {"metadata_route": datapath.DHCP_SERVER6}
    else:
        listed = [{"address": datapath.GUEST_IP, "netmask": str(datapath.NETWORK.netmask),
                   "network": str(datapath.NETWORK.network_address), "cidr": datapath.NETWORK.prefixlen,
                   "address_family": 4, "public": False}]
        way = {"gateway": {"metadata_route": "gateway", "gateway": datapath.GATEWAY},
               "dhcp": {"metadata_route": datapath.DHCP_SERVER}}.get(route.route, {"metadata_route": "onlink"})
    for item in listed:
        item.update({"dhcp": True} if dhcp else way)
    return {
        "id": guest.uuid, "hostname": hostname, "ssh_keys": [guest.key], "plan": "lab.small", "facility": "lab1",
        "network": {"interfaces": [{"name": nic, "mac": guest.mac}], "addresses": listed},
    }


def refusal(options: Options) -> str | None:
    """Why this run cannot be made at all (checked before anything starts), else None."""
    chosen = flavor(options.flavor)
    tagged = options.device_tags or options.hotplug
    checks = (
        (options.ipv6_only and chosen.ipv6_refused is not None and options.suite in OLD_CLOUD_INIT,
         (f"--ipv6-only: flavor {chosen.name} cannot reach metadata without IPv4 on {options.suite}: "
          f"{chosen.ipv6_refused} (--suite trixie has 25.1)")),
        (options.ipv6_only and options.route not in (None, "gateway"),
         f"--ipv6-only: --route {options.route} is IPv4's (IPv6 goes through the advertised router)"),
        (options.ganeti_install and chosen.config_drive,
         "--ganeti-install: a config drive guest has no metadata network to install through"),
        (tagged and chosen.name not in ("openstack", "configdrive"),
         "--device-tags/--hotplug: device role tags are OpenStack's (flavor openstack or configdrive)"),
        (options.hotplug and (chosen.config_drive or options.ipv6_only or bool(options.url)),
         "--hotplug: an OpenStack guest over IPv4 with the lab's own server (a config drive cannot change)"),
        (options.dhcp_gone and ((options.route or chosen.route) != "dhcp" or options.ipv6_only),
         "--dhcp-gone removes the DHCP port the guest's route goes through: it needs --route dhcp (IPv4)"),
        (options.ganeti_install and bool(options.url),
         "--ganeti-install serves the image from the run directory through the lab's own imds serve: drop --url"),
        (options.systemd_imds and (chosen.name != "ec2" or options.ipv6_only or bool(options.url)),
         ("--systemd-imds: the lab sets EC2's SMBIOS for systemd-imds to find imds by (IPv4, the lab's own "
          "serve, whose log proves the reads); the other flavors name imds on the kernel command line "
          "(docs/guest.md)")),
    )
    return next((reason for refused, reason in checks if refused), None)


def boot(options: Options, say: Callable[[str], None]) -> dict[str, Any]:
    """Boot the guest once; the result (also in OUT/result.json). Everything made is undone before returning."""
    reason = refusal(options)
    if reason:
        raise LabError(reason)
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    chosen = flavor(options.flavor)
    route = datapath.Route(options.route or chosen.route, ipv6_only=options.ipv6_only, dhcp_gone=options.dhcp_gone)
    result: dict[str, Any] = {"flavor": chosen.name, "identify": options.identify, "hostname": options.hostname,
                              "ipv6_only": options.ipv6_only, "route": route.name,
                              "network_data": options.network_data,
                              "expected_datasource": chosen.datasource, "passed": False,
                              "image": {"suite": options.image.suite, "cloud_init": options.image.cloud_init,
                                        "key": options.image.key or None}}
    try:
        with cleaned_up() as cleanup:
            try:
                _run(cleanup, options, (chosen, route), result, say)
            finally:
                result["cleanup_failures"] = cleanup.failures  # filled as close() runs; the list is shared
    except LabError as exc:
        result["error"] = exc.message
    except KeyboardInterrupt:
        result["error"] = "interrupted"
        _write(out, result)
        raise
    finally:
        _write(out, result)
    return result


def _write(out: Path, result: dict[str, Any]) -> None:
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")


def _run(cleanup: Cleanup, options: Options, way: tuple[Flavor, datapath.Route], result: dict[str, Any],
         say: Callable[[str], None]) -> None:
    out = options.out
    chosen, route = way
    v6 = options.ipv6_only
    guest = _guest(chosen, out)
    result["instance_id"] = guest.uuid
    install = Install(out) if options.ganeti_install else None
    scripts = [(LATE_SCRIPT, late_script(chosen, guest.uuid, guest.mac, ipv6=v6))]
    url = METADATA_URL6 if v6 else METADATA_URL
    document = _metadata(guest, options.hostname, route, dhcp=options.network_data == "dhcp",
                         nic=hotplug.BOOT_NIC if options.hotplug else "eth0")
    if options.systemd_imds:  # systemd-imds's public IPv4 and IPv6 keys read these (documentation ranges)
        document["network"]["addresses"] += public_addresses()
        scripts.append((SYSTEMD_SCRIPT, systemd_script()))
    tagged = options.device_tags or options.hotplug
    if tagged:
        document["devices"] = devices.boot_devices(guest.mac)
        scripts.append((devices.SCRIPT, devices.devices_script(
            guest_zipapp(), devices.source(config_drive=chosen.config_drive, metadata_url=url))))
    if install is not None:
        install.build_image(guest.uuid)
        scripts.append((SCRIPT, guest_script(guest_zipapp(), url)))
    server = _server(cleanup, options, install.serve_args() if install else [])
    result["server"] = server.url
    userdata = lab_userdata(options.userdata, options.marker, scripts, [hotplug.USERDATA] if options.hotplug else [])
    server.push(guest.uuid, addresses(guest, ipv6_only=v6), document, userdata)
    probe = _probe(options, guest, userdata)
    say(f"lab: record {guest.uuid} ({options.hostname}) pushed to {server.url}")
    installing = Installing(install, server, guest.uuid) if install else None
    names = datapath.Names(secrets.token_hex(2))
    result["tag"] = names.tag
    secret = options.secret_file or out / "shared-secret"
    port = datapath.Guest(guest.uuid, guest.mac, names.tap)
    network = datapath.Datapath(cleanup, out, names)
    switch = network.build(port, server.url, secret, route)
    say(f"lab: datapath up (bridge {names.bridge}, tap {names.tap}, agent + haproxy, dnsmasq; {route.name})")
    gone = DhcpGone(network, time.time()) if route.dhcp_gone else None
    cdrom = _config_drive(out, guest, server) if chosen.config_drive else None
    kernel_args = (*chosen.kernel_args(options.identify, ipv6=v6), *(KERNEL_ARGS if probe else ()))
    machine = Machine(options.image, out, names.tap, guest.mac, kernel_args,
                      chosen.smbios_arg(options.identify, guest.uuid, ipv6=v6), cdrom,
                      install.disk if install else None,
                      (fresh_disk(out / devices.DISK, 8 << 20), devices.DISK_SERIAL) if tagged else None,
                      names.qmp if options.hotplug else None, names.host.enter,
                      smbios_extra=(BIOS_VENDOR,) if probe else ())
    qemu = Qemu(machine)
    cleanup.add("stop qemu", qemu.stop)
    watch = Watch(qemu, options, chosen, server, say, lambda: switch.learned(names.bridge), installing,
                  tick=gone.poll if gone else None, probe=probe)
    if options.hotplug:
        watch.hotplug = hotplug.Hotplug(
            server, guest.uuid, addresses(guest, ipv6_only=v6), document, hotplug.hot_mac(guest.mac),
            lambda tap, mac, vlan: network.plug(switch, datapath.Guest(guest.uuid, mac, tap), vlan),
            lambda tap: network.unplug(switch, tap), lambda: switch.ofctl("--no-stats", "dump-flows", names.bridge),
            names.hot_tap, out, say)
    watch.run(result)
    if gone is not None:  # the seed's upgrade case: who answered for the DHCP port's address after it went
        result["dhcp_gone"] = {"removed_after_s": gone.removed_after, "next_hop_arp_answers": gone.answers()}
        result["passed"] = result["passed"] and gone.removed_after is not None and gone.answers() > 0


def _probe(options: Options, guest: Guest, userdata: bytes) -> Probe | None:
    """--systemd-imds: the values systemd-imds must read (as the EC2 flavor renders the lab's record)."""
    if not options.systemd_imds:
        return None
    expected = {"hostname": options.hostname, "region": "lab", "zone": "lab1", "ipv4-public": "198.51.100.7",
                "ipv6-public": "2001:db8:ec2::7", "ssh-key": guest.key, "userdata": ""}
    return Probe(expected, userdata)


def _server(cleanup: Cleanup, options: Options, extra: list[str]) -> Server:
    if options.url:
        if options.secret_file is None:
            msg = "--url needs --shared-secret-file: the secret that server trusts 127.0.0.1/32 with"
            raise LabError(msg)
        return remote_server(options.url, options.admin_token)
    secret = options.out / "shared-secret"
    write_private(secret, secrets.token_hex(32).encode())
    return own_server(cleanup, options.out, secret, options.imdsv2, extra)


def _config_drive(out: Path, guest: Guest, server: Server) -> Path:
    """An ISO 9660 config-2 drive for the guest, rendered by ``imds configdrive build`` from the lab's SQLite."""
    drive = out / "config-drive.iso"
    if server.log is None:
        msg = "--flavor configdrive renders the drive from the lab's own server's store: drop --url"
        raise LabError(msg)
    imds = Path(sys.executable).parent / "imds"
    sh(str(imds) if imds.exists() else "imds", "configdrive", "build",
       "--db", f"sqlite:///{(out / 'imds.sqlite').resolve()}", "--instance", guest.uuid, "--output", str(drive))
    return drive


@dataclass
class Watch:
    """QEMU under each accelerator in turn until one runs; the console watched until done, exit or timeout."""

    qemu: Qemu
    options: Options
    chosen: Flavor
    server: Server
    say: Callable[[str], None]
    learned: Callable[[], bool]  # whether the datapath has seen the guest's first metadata packet
    installing: Installing | None = None  # --ganeti-install: prepared before each power-on, judged at the end
    hotplug: hotplug.Hotplug | None = None  # --hotplug: run once the boot has passed, QEMU still running
    probe: Probe | None = None  # --systemd-imds: judged from the console and serve's log at the end
    first_packet: float | None = None
    tick: Callable[[], None] | None = None  # called on each look at the console (--dhcp-gone retires the port)

    def _console(self) -> Console:
        options = self.options
        tagged = options.device_tags or options.hotplug
        return Console(self.qemu.machine.serial, options.marker, options.hostname,
                       install=CONSOLE if self.installing else None, late=LATE,
                       expect_devices=devices.expected(self.qemu.machine.mac) if tagged else ())

    def run(self, result: dict[str, Any]) -> None:
        """Boot, watch, and fill ``result``."""
        qemu, options = self.qemu, self.options
        console = self._console()
        power_on = time.time()
        outcome = "no accelerator could run the guest"
        for accel in accelerators(options.accel):
            console = self._console()
            if self.installing:
                self.installing.prepare()
            power_on = time.time()
            self.first_packet = None
            qemu.start(accel)
            self.say(f"lab: qemu started ({accel}), console {qemu.machine.serial}")
            outcome = self._until_done(console, power_on + options.timeout)
            if outcome != "kvm failed":
                break
            failure = qemu.kvm_failure()
            self.say(f"lab: KVM cannot run this guest ({failure}); falling back to TCG")
            result.setdefault("kvm_failure", failure)
            qemu.stop()
        if self.hotplug and outcome == "done" and self.qemu.machine.qmp:
            result["hotplug"] = self.hotplug.run(self.qemu.machine.qmp, console)
        qemu.stop()
        self._record(result, console, power_on, outcome)
        if "hotplug" in result:
            result["passed"] = result["passed"] and result["hotplug"]["passed"]
        if self.installing:  # QEMU has stopped: the second disk is read as it was left
            result["ganeti_install"] = found = self.installing.verdict(console.install_exit)
            result["passed"] = result["passed"] and found["passed"]
        if self.probe is not None:
            serial = self.qemu.machine.serial
            lines = serial.read_text(errors="replace").splitlines() if serial.exists() else []
            result["systemd_imds"] = judged = systemd_verdict(lines, self.server.reads(power_on),
                                                              self.probe.expected, self.probe.userdata)
            result["passed"] = result["passed"] and judged["passed"]
        self.say(f"lab: {'PASS' if result['passed'] else 'FAIL'} ({outcome}); result {options.out / 'result.json'}")

    def _until_done(self, console: Console, deadline: float) -> str:
        qemu, datasource = self.qemu, self.chosen.datasource
        while True:
            console.poll()
            if self.tick is not None:
                self.tick()
            if self.first_packet is None and self.learned():
                self.first_packet = time.time()
            if console.done(datasource):
                return "done"
            if console.late_reported:
                return "late read failed"
            if qemu.kvm_failure():
                return "kvm failed"
            if qemu.exited() is not None:
                console.poll()
                return "done" if console.done(datasource) else f"qemu exited {qemu.exited()}"
            if time.time() > deadline:
                return "timeout"
            time.sleep(0.5)

    def _record(self, result: dict[str, Any], console: Console, power_on: float, outcome: str) -> None:
        requests = self.server.reads(power_on)
        seen = sorted(console.seen.items(), key=lambda item: item[1])
        result.update(
            outcome=outcome, passed=outcome == "done", accel=self.qemu.accel, datasource=console.datasource,
            cloud_init=console.version, marker=console.marker_line, login_host=console.login_host,
            hostname_seen="hostname" in console.seen,
            seconds={name: round(at - power_on, 1) for name, at in seen},
            guest_uptime={"stages": console.stages, "final": console.final_uptime},
            requests=requests if self.server.log is not None else None,
        )
        result["late_read"] = {"passed": "late read" in console.seen, "line": console.late_line,
                               "routes": console.late_report}
        if console.expect_devices:
            result["device_tags"] = {"passed": console.devices_shown(), "devices": sorted(console.devices)}
        packet = round(self.first_packet - power_on, 1) if self.first_packet else None
        result["seconds"]["first_metadata_packet"] = packet  # the agent's flow learned its way back
        result["seconds"]["first_metadata_request"] = requests[0]["t"] if requests else packet

