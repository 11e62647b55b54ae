"""What each flavor asks of the guest: the datasource cloud-init must choose, and how it is told to.

``--identify cmdline`` (the default) names the datasource on the kernel command line
(``ci.ds=``, which ds-identify honours); ``--identify smbios`` sets the SMBIOS system fields
that ds-identify and the datasources themselves look for on each cloud, as a hypervisor of
that cloud does (the same values work in libvirt's ``<sysinfo type='smbios'>``; docs/lab.md).
NoCloud over the network also needs its seed URL, which the command line or the SMBIOS
serial carries.

``--ipv6-only`` (no IPv4 in the guest at all): what cloud-init 22.4 (bookworm) can do, read in its source.
EC2's datasource lists ``http://[fd00:ec2::254]`` after 169.254.169.254 (and its local stage
brings the link up for IPv6 when DHCPv4 gets no lease); NoCloud takes any seed URL, so the
seed names ``[fd00:ec2::254]``; a config drive needs no network. The OpenStack datasource
knows only ``http://169.254.169.254`` and its local stage runs DHCPv4 alone
(``fe80::a9fe:a9fe`` came in 23.x): the lab refuses it on bookworm. cloud-init 25.1 (``--suite
trixie``) asks ``fe80::a9fe:a9fe`` first, in its network stage, with the zone the trixie image
sets (the NIC's index: its own default, the NIC's name, never connects; ``imds.lab.image``).

``--route`` is how DHCP tells the guest the way to 169.254.169.254, the three of Neutron's
metadata spec: ``gateway`` (a default route; the lab's router answers for the gateway address),
``dhcp`` (option 121 via the DHCP port's address, what Neutron's DHCP agent hands out for an
isolated subnet: the default but for EC2), ``onlink`` (option 121, on-link).
"""

from __future__ import annotations

from dataclasses import dataclass

from imds.errors import LabError

METADATA_URL = "http://169.254.169.254"
METADATA_URL6 = "http://[fd00:ec2::254]"  # AWS's IPv6 address: cloud-init's EC2 datasource asks it
NOCLOUD_SEED = "ds=nocloud-net;s={metadata}/nocloud/"
NOCLOUD_SEED_SMBIOS = f"serial={NOCLOUD_SEED}"
ROUTES = ("onlink", "dhcp", "gateway")


@dataclass(frozen=True)
class Flavor:
    """One way a guest finds its metadata."""

    name: str
    ds: str  # ds-identify's name (ci.ds=)
    datasource: str  # the class cloud-init reports on the console ("Datasource DataSourceEc2.")
    smbios: tuple[str, ...] = ()  # -smbios type=1 fields, '{uuid}' replaced by the instance id
    cmdline: tuple[str, ...] = ()  # extra kernel arguments either way
    config_drive: bool = False  # attach an ISO 9660 config-2 drive
    uuid_prefix: str = ""  # instance ids start so (AWS's start with "ec2", which cloud-init checks)
    platform: bool = False  # give the SMBIOS fields even with --identify cmdline (the datasource needs them)
    route: str = "dhcp"  # the default --route: 169.254.169.254 via the DHCP port (option 121), as Neutron's DHCP agent
    ipv6_refused: str | None = None  # why cloud-init 22.4 cannot read this flavor's metadata over IPv6 alone

    def kernel_args(self, identify: str, *, ipv6: bool = False) -> list[str]:
        """Kernel arguments that make ds-identify pick this flavor's datasource."""
        if identify != "cmdline":
            return []
        return [f"ci.ds={self.ds}", *(_at(arg, ipv6=ipv6) for arg in self.cmdline)]

    def smbios_arg(self, identify: str, uuid: str, *, ipv6: bool = False) -> str | None:
        """QEMU's ``-smbios type=1,...`` value (None when identifying by command line)."""
        if identify != "smbios" and not self.platform:
            return f"type=1,uuid={uuid}"
        fields = [_at(field, ipv6=ipv6).replace("{uuid}", uuid) for field in self.smbios]
        if not any(field.startswith("uuid=") for field in fields):
            fields.append(f"uuid={uuid}")
        return "type=1," + ",".join(field.replace(",", ",,") for field in fields)


def _at(text: str, *, ipv6: bool) -> str:
    """``text`` with ``{metadata}`` replaced by the metadata URL the guest can reach."""
    return text.replace("{metadata}", METADATA_URL6 if ipv6 else METADATA_URL)


FLAVORS = {
    # AWS: the serial and the uuid start with "ec2" and are equal (cloud-init's identify_aws). cloud-init
    # 22.4 asks for an IMDSv2 token only on a platform it identified as AWS, so these are always given.
    # DHCP gives a router by default, as AWS does (and as it had to while imds's metadata had no vpc-id:
    # cloud-init then took the instance for EC2-Classic and crawled again in its network stage, with
    # DHCP on the configured NIC, which failed re-adding an option-121 route that existed).
    "ec2": Flavor("ec2", "Ec2", "DataSourceEc2", smbios=(
        "manufacturer=Amazon EC2", "product=t3.micro", "serial={uuid}",
    ), uuid_prefix="ec2", platform=True, route="gateway"),
    # cloud-init's OpenStack datasource reads nothing unless DMI says OpenStack (detect_openstack).
    "openstack": Flavor("openstack", "OpenStack", "DataSourceOpenStack", smbios=(
        "manufacturer=OpenStack Foundation", "product=OpenStack Nova",
    ), platform=True, ipv6_refused=(
        "cloud-init 22.4's OpenStack datasource asks only http://169.254.169.254 (IPv4) and its local stage "
        "runs DHCPv4 alone; fe80::a9fe:a9fe came in cloud-init 23.x")),
    "nocloud": Flavor("nocloud", "NoCloud", "DataSourceNoCloud", smbios=(NOCLOUD_SEED_SMBIOS,),
                      cmdline=(NOCLOUD_SEED,)),
    "configdrive": Flavor("configdrive", "ConfigDrive", "DataSourceConfigDrive", smbios=(
        "manufacturer=OpenStack Foundation", "product=OpenStack Nova",
    ), config_drive=True),
}
IDENTIFY = ("cmdline", "smbios")


def flavor(name: str) -> Flavor:
    """The flavor called ``name``; LabError naming the known ones otherwise."""
    try:
        return FLAVORS[name]
    except KeyError:
        msg = f"unknown flavor {name!r}: one of {', '.join(FLAVORS)}"
        raise LabError(msg) from None

