"""``imds lab``: build the guest image and boot real VMs through the datapath."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click

from imds.cli.options import resolve
from imds.errors import LabError

CHOICES_FLAVOR = ("ec2", "openstack", "nocloud", "configdrive")
ROUTES = ("onlink", "dhcp", "gateway")  # imds.lab.flavors.ROUTES (not imported: the lab loads only when it runs)
SUITES = ("bookworm", "trixie", "sid")  # imds.lab.image.SUITES


def _recipe_options(command: Any) -> Any:
    """``--suite`` and ``--package``: which image recipe (each its own cached image)."""
    command = click.option("--package", "packages", multiple=True, metavar="NAME",
                           help="One more Debian package in the image (repeatable; part of the cache key).")(command)
    return click.option("--suite", type=click.Choice(SUITES), default="bookworm", show_default=True,
                        help="The Debian suite the image is built from: bookworm (cloud-init 22.4), "
                             "trixie (25.1) or sid.")(command)


def default_image_dir() -> Path:
    """Where built images are cached: $XDG_CACHE_HOME/imds-lab (else ~/.cache/imds-lab)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "imds-lab"


def _say(line: str) -> None:
    click.echo(line, err=True)


def _options(options: Any, flags: dict[str, Any], chosen: Any, userdata: bytes | None) -> Any:
    """``imds.lab.boot.Options`` from the command's flags (the class passed in: it loads only when the lab runs).

    With ``--url`` and no ``--admin-token``, the token is the configured one (IMDS_ADMIN_TOKEN, read by
    ``imds.config`` as for every command).
    """
    token = flags["admin_token"] or (resolve({}).admin.admin_token if flags["url"] else None)
    return options(
        flags["flavor"], flags["out"], flags["hostname"], chosen, userdata, flags["marker"], flags["timeout"],
        flags["accel"], IDENTIFY[flags["identify"]], flags["url"], token, flags["shared_secret_file"],
        flags["imdsv2"], flags["ipv6_only"], flags["route"], flags["ganeti_install"], flags["suite"],
        flags["network_data"], flags["device_tags"] or flags["hotplug"], flags["hotplug"],
        dhcp_gone=flags["dhcp_gone"], systemd_imds=flags["systemd_imds"],
    )


@click.group()
def lab() -> None:
    """Real guests: a Debian image, QEMU, and the production datapath (needs root)."""


@lab.group()
def image() -> None:
    """The guest image (built from Debian packages, cached by its recipe)."""


@image.command("build")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=default_image_dir,
              show_default="$XDG_CACHE_HOME/imds-lab", help="Cache directory: one subdirectory per recipe.")
@click.option("--mirror", default=None, help="Debian mirror URL for mmdebstrap (default: its own).")
@_recipe_options
def image_build(out: Path, mirror: str | None, suite: str, packages: tuple[str, ...]) -> None:
    """Build the guest image unless the current recipe's is already in OUT; print its path."""
    from imds.lab.image import Recipe, build  # noqa: PLC0415 - loads only when the lab runs
    from imds.lab.run import cleaned_up  # noqa: PLC0415

    try:
        with cleaned_up():  # SIGTERM unwinds like Ctrl-C: mmdebstrap is stopped, the half-built tree removed
            built = build(out, mirror, _say, Recipe(suite, packages))
    except LabError as exc:
        raise click.ClickException(exc.message) from exc
    click.echo(built.disk.parent)


# The boot's scenarios that are on or off (each an Options field of the same name), in --help's order.
SCENARIOS = {
    "--dhcp-gone": "With --route dhcp: remove the DHCP port once the guest has its lease; the agent answers ARP "
                   "for its address (--metadata-next-hop), as after an upgrade that dropped the DHCP ports.",
    "--ganeti-install": "The guest also installs an OS image onto a second, empty disk through the Ganeti paths "
                        "(imds-guest ganeti install); not with configdrive or --url.",
    "--device-tags": "A tagged NIC and data disk in the record; the guest applies the tags with imds-guest udev "
                     "(openstack or configdrive).",
    "--hotplug": "After the boot: a NIC and a tagged disk attached to the running guest (QMP) and the record, "
                 "configured by cloud-init's hotplug, then detached (openstack, IPv4; implies --device-tags).",
    "--systemd-imds": "systemd-imds in the guest (sid: --suite sid --package systemd-imds) must find imds from EC2's "
                      "SMBIOS and read every key it knows (ec2 only).",
}


def _scenario_switches(command: Any) -> Any:
    """One ``--NAME`` flag (off unless given) for each of ``SCENARIOS``."""
    for name, text in reversed(SCENARIOS.items()):  # the last decorator applied is the first listed
        command = click.option(name, is_flag=True, default=False, help=text)(command)
    return command


# --identify: "forced" names the datasource on the kernel command line; "cmdline" is its older name.
IDENTIFY = {"forced": "cmdline", "cmdline": "cmdline", "smbios": "smbios"}


@lab.command("boot")
@click.option("--flavor", type=click.Choice(CHOICES_FLAVOR), default="ec2", show_default=True)
@click.option("--userdata", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Userdata file (default: cloud-config printing the marker and hostname to the console).")
@click.option("--hostname", default="lab-guest", show_default=True, help="The hostname in the guest's record.")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Run directory: serial.log, result.json, every daemon's log.")
@click.option("--image", "image_file", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Boot this disk image (any cloud image with cloud-init) instead of the built one.")
@click.option("--image-dir", type=click.Path(file_okay=False, path_type=Path), default=default_image_dir,
              show_default="$XDG_CACHE_HOME/imds-lab", help="Where the built image is cached (built if missing).")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds from power-on to give up.")
@click.option("--url", default=None, help="Use this imds serve (it must trust 127.0.0.1/32) instead of the lab's own.")
@click.option("--admin-token", default=None, help="Admin token for --url (default: IMDS_ADMIN_TOKEN).")
@click.option("--shared-secret-file", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="With --url: the proxy shared secret that server checks.")
@click.option("--accel", type=click.Choice(("auto", "kvm", "tcg")), default="auto", show_default=True,
              help="auto: KVM, falling back to TCG when KVM cannot run the guest.")
@click.option("--identify", type=click.Choice(("forced", "cmdline", "smbios")), default="forced", show_default=True,
              help="How ds-identify learns the datasource: forced on the kernel command line (ci.ds=; "
                   "'cmdline' is the same), or the cloud's SMBIOS fields alone.")
@click.option("--ipv6-only", is_flag=True, default=False,
              help="No IPv4 in the guest: router advertisements (SLAAC) and DHCPv6; metadata at [fd00:ec2::254].")
@click.option("--network-data", type=click.Choice(("static", "dhcp")), default="static", show_default=True,
              help="What the guest's record says of its subnet: static addresses with the way to metadata --route "
                   "set up, or that the subnet has DHCP (network_data.json then says ipv4_dhcp, as Nova's).")
@click.option("--route", type=click.Choice(ROUTES), default=None, show_default="the flavor's: gateway for ec2, "
              "else dhcp", help="How DHCP gives the way to 169.254.169.254: a default route to the lab's router "
              "(gateway), option 121 via the DHCP port (dhcp) or on-link (onlink).")
@_scenario_switches
@click.option("--marker", default="LAB-MARKER", show_default=True, help="The line the userdata prints.")
@click.option("--imdsv2", type=click.Choice(("required", "optional")), default="required", show_default=True,
              help="The lab's own server: EC2 tokens required or optional.")
@_recipe_options
def boot(**flags: Any) -> None:
    """Boot one guest through the datapath; exit 0 when cloud-init applied its hostname and userdata."""
    from imds.lab import image as images  # noqa: PLC0415 - loads only when the lab runs
    from imds.lab.boot import Options, refusal  # noqa: PLC0415
    from imds.lab.boot import boot as run_boot  # noqa: PLC0415
    from imds.lab.run import cleaned_up  # noqa: PLC0415

    image_file: Path | None = flags["image_file"]
    userdata: Path | None = flags["userdata"]
    try:
        reason = refusal(_options(Options, flags, None, None))
        if reason:  # at once: no image build, no boot
            raise click.UsageError(reason)
        with cleaned_up():  # SIGTERM during a build unwinds like Ctrl-C
            recipe = images.Recipe(flags["suite"], flags["packages"])
            chosen = (images.Image(image_file.resolve()) if image_file else
                      images.build(flags["image_dir"], None, _say, recipe))
        result = run_boot(_options(Options, flags, chosen, userdata.read_bytes() if userdata else None), _say)
    except LabError as exc:
        raise click.ClickException(exc.message) from exc
    click.echo(json.dumps({k: result.get(k) for k in ("passed", "datasource", "accel", "seconds", "error")}))
    if not result["passed"]:
        raise SystemExit(1)
