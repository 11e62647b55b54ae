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
from imds.lab import datapath
from imds.lab.console import Console
from imds.lab.flavors import METADATA_URL, METADATA_URL6, Flavor, flavor
from imds.lab.ganeti import CONSOLE, SCRIPT, Install, Installing, guest_script, guest_zipapp
from imds.lab.image import Image
from imds.lab.qemu import Machine, Qemu, accelerators
from imds.lab.run import Cleanup, cleaned_up, sh, write_private
from imds.lab.server import Server, own_server, remote_server
from imds.lab.systemd_imds import BIOS_VENDOR, KERNEL_ARGS, public_addresses
from imds.lab.systemd_imds import SCRIPT as SYSTEMD_SCRIPT
from imds.lab.systemd_imds import guest_script as systemd_script
from imds.lab.systemd_imds import verdict as systemd_verdict
from imds.lab.userdata import MARKER, lab_userdata


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


def _metadata(guest: Guest, hostname: str, *, ipv6_only: bool, dhcp: bool = False,
              public: bool = False) -> dict[str, Any]:
    if ipv6_only:
        network = datapath.NETWORK6
        listed = [{"address": address, "network": str(network.network_address), "cidr": network.prefixlen,
                   "address_family": 6, "public": False} for address in addresses(guest, ipv6_only=True)]
    else:
        listed = [{"address": datapath.GUEST_IP, "netmask": str(datapath.NETWORK.netmask),
                   "network": str(datapath.NETWORK.network_address), "cidr": datapath.NETWORK.prefixlen,
                   "address_family": 4, "public": False}]
    if public:  # systemd-imds's public IPv4 and IPv6 keys read these (documentation ranges, never routed)
        listed += public_addresses()
    document: dict[str, Any] = {
        "id": guest.uuid, "hostname": hostname, "ssh_keys": [guest.key], "plan": "lab.small", "facility": "lab1",
        "network": {"interfaces": [{"name": "eth0", "mac": guest.mac}], "addresses": listed},
    }
    if dhcp:  # network_data.json says DHCP (as Nova's does for a subnet with DHCP): the option-121 route stays
        document["network_data"] = {
            "links": [{"id": "eth0", "name": "eth0", "type": "phy", "ethernet_mac_address": guest.mac}],
            "networks": [{"id": "network0", "type": "ipv4_dhcp", "link": "eth0"}], "services": []}
    return document


def refusal(options: Options) -> str | None:
    """Why this run cannot be made at all (checked before anything starts), else None."""
    chosen = flavor(options.flavor)
    if options.ipv6_only and chosen.ipv6_refused:
        return f"--ipv6-only: flavor {chosen.name} cannot reach metadata without IPv4: {chosen.ipv6_refused}"
    if options.ipv6_only and options.route not in (None, "gateway"):
        return f"--ipv6-only: --route {options.route} is IPv4's (IPv6 goes through the advertised router)"
    if options.ganeti_install and chosen.config_drive:
        return "--ganeti-install: a config drive guest has no metadata network to install through"
    if options.ganeti_install and options.url:
        return "--ganeti-install serves the image from the run directory through the lab's own imds serve: drop --url"
    if options.systemd_imds and (chosen.name != "ec2" or options.ipv6_only or options.url):
        return ("--systemd-imds: the lab sets EC2's SMBIOS for systemd-imds to find imds by (IPv4, the lab's own "
                "serve, whose log proves the reads); the other flavors name imds on the kernel command line "
                "(docs/guest.md)")
    return None


def boot(options: Options, say: Callable[[str], None]) -> dict[str, Any]:
    """Boot the guest once; the result (also in OUT/result.json). Everything made is undone before returning."""
    reason = refusal(options)
    if reason:
        raise LabError(reason)
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    chosen = flavor(options.flavor)
    route = datapath.Route(options.route or chosen.route, ipv6_only=options.ipv6_only)
    result: dict[str, Any] = {"flavor": chosen.name, "identify": options.identify, "hostname": options.hostname,
                              "ipv6_only": options.ipv6_only, "route": route.name,
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
    scripts = []
    if options.systemd_imds:
        scripts.append((SYSTEMD_SCRIPT, systemd_script()))
    if install is not None:
        install.build_image(guest.uuid)
        scripts.append((SCRIPT, guest_script(guest_zipapp(), METADATA_URL6 if v6 else METADATA_URL)))
    server = _server(cleanup, options, install.serve_args() if install else [])
    result["server"] = server.url
    document = _metadata(guest, options.hostname, ipv6_only=v6, dhcp=options.ganeti_install and not v6,
                         public=options.systemd_imds)
    userdata = lab_userdata(options.userdata, options.marker, scripts)
    server.push(guest.uuid, addresses(guest, ipv6_only=v6), document, userdata)
    probe = _probe(options, guest, userdata)
    say(f"lab: record {guest.uuid} ({options.hostname}) pushed to {server.url}")
    installing = Installing(install, server, guest.uuid) if install else None
    names = datapath.Names(secrets.token_hex(2))
    secret = options.secret_file or out / "shared-secret"
    port = datapath.Guest(guest.uuid, guest.mac, names.tap)
    switch = datapath.Datapath(cleanup, out, names).build(port, server.url, secret, route)
    say(f"lab: datapath up (bridge {names.bridge}, tap {names.tap}, agent + haproxy, dnsmasq; {route.name})")
    cdrom = _config_drive(out, guest, server) if chosen.config_drive else None
    kernel_args = (*chosen.kernel_args(options.identify, ipv6=v6), *(KERNEL_ARGS if probe else ()))
    machine = Machine(options.image, out, names.tap, guest.mac, kernel_args,
                      chosen.smbios_arg(options.identify, guest.uuid, ipv6=v6), cdrom,
                      install.disk if install else None, smbios_extra=(BIOS_VENDOR,) if probe else ())
    qemu = Qemu(machine)
    cleanup.add("stop qemu", qemu.stop)
    Watch(qemu, options, chosen, server, say, lambda: switch.learned(names.bridge), installing, probe).run(result)


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
    probe: Probe | None = None  # --systemd-imds: judged from the console and serve's log at the end
    first_packet: float | None = None

    def _console(self) -> Console:
        options = self.options
        return Console(self.qemu.machine.serial, options.marker, options.hostname,
                       install=CONSOLE if self.installing else None)

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
        qemu.stop()
        self._record(result, console, power_on, outcome)
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
            if self.first_packet is None and self.learned():
                self.first_packet = time.time()
            if console.done(datasource):
                return "done"
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
        packet = round(self.first_packet - power_on, 1) if self.first_packet else None
        result["seconds"]["first_metadata_packet"] = packet  # the agent's flow learned its way back
        result["seconds"]["first_metadata_request"] = requests[0]["t"] if requests else packet

