"""The EC2 flavor: hollow's ``2009-04-04`` subset, and the AWS layout real clients crawl.

Both are pure functions of the canonical record (and, for the identity document, a
signer). Mapping from the Equinix-shaped document:

| EC2 key | from |
|---|---|
| instance-id, hostname, local-hostname | the record id, ``hostname`` |
| instance-type | ``plan`` |
| ami-id | ``operating_system.image_tag`` (else ``operating_system.slug``) |
| placement/availability-zone | ``availability_zone``, else ``facility`` |
| placement/region | ``region``, else the zone minus its last character, else ``metro`` |
| local-ipv4 / public-ipv4 / ipv6s | ``network.addresses`` (family + ``public``) |
| mac, network/interfaces/macs/… | ``network.interfaces`` (addresses go to the bond's MAC, else the first) |
| macs/MAC/vpc-id | ``network.vpc_id``, else ``vpc-`` + a hash of ``project_id`` (else ``default``) |
| macs/MAC/subnet-id, interface-id | ``subnet-`` + a hash of the VPC and subnet CIDR; ``eni-`` + a hash of the MAC |
| public-keys/N/openssh-key | ``ssh_keys`` (name: the key's comment, made unique with ``-N``) |
| tags/instance/KEY | ``tags`` entries of the form ``key=value`` |
| ipv6 | the first IPv6 address in ``network.addresses`` (a public one first) |
| spot/termination-time | ``spot.termination_time`` (a spot interruption notice wins) |
| block-device-mapping/ami, root | ``storage.disks[0].device`` |
| events/, spot/instance-action, autoscaling/ | the notices reaching the instance (``imds.services.render.events``) |

botocore and cloud-init (off AWS) derive the region by dropping the availability zone's
last character (as AWS names zones: ``us-east-1a``), so without an explicit ``region``
the flavor reports that same region (facility ``da11`` → region ``da1``, not the metro
``da``) in ``placement/region`` and the identity document: every client sees one region.
An explicit ``region`` wins; it should then match the zone.

cloud-init takes an instance whose MACs have no ``vpc-id`` for EC2 Classic and then
re-applies the network configuration on every boot, crawling the tree a second time
(cloud-init 22.4 ``is_classic_instance``): every MAC carries one. The derived ids are
stable (the same record gives the same ids on every replica) and shaped as AWS's (17 hex
digits after the prefix).

The instance id is always the record's id (the document's own ``id``, which writes
require to be the same, is not consulted).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from functools import partial
from typing import Any, NamedTuple, Protocol

from imds.models import Instance, JsonObject
from imds.services.render.context import Context
from imds.services.render.events import ec2_items
from imds.services.render.fields import as_list, as_object
from imds.services.render.pretty import pretty
from imds.services.render.tree import Dir, Later, Leaf

HOLLOW_VERSION = "2009-04-04"
AWS_VERSIONS = ("2016-09-02", "2018-09-24", "2021-03-23", "latest")
IDENTITY = "dynamic/instance-identity"  # the document and its signatures (``Later`` leaves), under an AWS version
VERSIONS = (HOLLOW_VERSION, *AWS_VERSIONS)


class Signer(Protocol):
    """Signs identity documents (see ``imds.services.identity.document``), each signature once per document."""

    def pkcs7_of(self, document: bytes) -> str:
        """Base64 DER PKCS#7 holding the document, AWS-style line-wrapped (served as ``pkcs7`` and ``rsa2048``)."""
        ...

    def signature_of(self, document: bytes) -> str:
        """Base64 RSA-SHA256 signature of the document."""
        ...


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


class _Address(NamedTuple):
    address: str
    family: int
    public: bool
    network: str | None


def _addresses(doc: JsonObject, *, networks: bool = True) -> list[_Address]:
    """The document's addresses; with ``networks``, each one's network (``network``/``cidr``) as CIDR text."""
    found = []
    for item in as_list(as_object(doc.get("network")).get("addresses")):
        if not isinstance(item, dict) or not isinstance(item.get("address"), str):
            continue
        network = None
        if networks and item.get("network") is not None and item.get("cidr") is not None:
            try:
                network = str(ipaddress.ip_network(f"{item['network']}/{item['cidr']}", strict=False))
            except ValueError:
                network = None
        found.append(_Address(item["address"], _family(item), item.get("public") is True, network))
    return found


def _family(item: JsonObject) -> int:
    """4 or 6 as the entry says (writes refuse anything else), else from the address; 0 if neither."""
    family = item.get("address_family")
    if family in (4, 6) and not isinstance(family, bool):
        return int(family)
    try:
        return ipaddress.ip_address(item["address"]).version
    except ValueError:
        return 0


def _matching(addresses: list[_Address], family: int, *, public: bool) -> list[str]:
    return [a.address for a in addresses if a.family == family and a.public is public]


# ----------------------------------------------------------------------------------------
# hollow's 2009-04-04 subset: exact text of hollow-metadataservice's EC2 router.


def hollow_meta_data(doc: JsonObject, instance_id: str | None = None) -> Dir:
    """Hollow's ``/2009-04-04/meta-data`` tree (subtrees listed without ``/``, as hollow does).

    ``instance_id`` is the record's id (default: the document's ``id``).
    """
    os_ = as_object(doc.get("operating_system"))
    items: list[tuple[str, Leaf | Dir]] = [
        ("instance-id", _text(doc.get("id") if instance_id is None else instance_id)),
        ("hostname", _text(doc.get("hostname"))),
        ("iqn", _text(doc.get("iqn"))),
        ("plan", _text(doc.get("plan"))),
        ("facility", _text(doc.get("facility"))),
        ("tags", "\n".join(_text(t) for t in as_list(doc.get("tags")))),
        (
            "operating-system",
            Dir(
                [
                    ("slug", _text(os_.get("slug"))),
                    ("distro", _text(os_.get("distro"))),
                    ("version", _text(os_.get("version"))),
                    ("license-activation",
                     Dir([("state", _text(as_object(os_.get("license_activation")).get("state")))], bare=True)),
                    ("image-tag", _text(os_.get("image_tag"))),
                ],
                bare=True,
            ),
        ),
        ("public-keys", "\n".join(_text(k) for k in as_list(doc.get("ssh_keys")))),
    ]
    if isinstance(doc.get("spot"), dict):
        items.append(("spot", Dir([("termination-time", _text(doc["spot"].get("termination_time")))], bare=True)))
    addresses = _addresses(doc, networks=False)
    for key, family, public in (("public-ipv4", 4, True), ("public-ipv6", 6, True), ("local-ipv4", 4, False)):
        values = _matching(addresses, family, public=public)
        if values:
            items.append((key, "\n".join(values)))
    return Dir(items, bare=True)


# ----------------------------------------------------------------------------------------
# The AWS layout.


def placement(doc: JsonObject) -> tuple[str, str]:
    """(region, availability zone) as the EC2 flavor reports them (see the module docstring)."""
    zone = _text(doc.get("availability_zone") or doc.get("facility"))
    if doc.get("region"):
        return _text(doc["region"]), zone
    derived = zone[:-1]  # what botocore's retrieve_region() and cloud-init's Ec2 datasource compute
    return derived or _text(doc.get("metro")), zone


def _key_name(key: str, index: int) -> str:
    parts = key.split()
    return parts[2] if len(parts) > 2 else f"key-{index}"


def _public_keys(doc: JsonObject) -> Dir | None:
    keys = [k for k in as_list(doc.get("ssh_keys")) if isinstance(k, str) and k.strip()]
    if not keys:
        return None
    # cloud-init keys public-keys by name: a repeated name would hide every key but the last.
    names: list[str] = []
    for i, key in enumerate(keys):
        name = _key_name(key, i)
        while name in names:
            name = f"{name}-{i}"
        names.append(name)
    return Dir(
        [(str(i), Dir([("openssh-key", key)])) for i, key in enumerate(keys)],
        labels={str(i): f"{i}={name}" for i, name in enumerate(names)},
    )


def aws_id(prefix: str, seed: str) -> str:
    """A stable AWS-shaped id (``vpc-`` and 17 hex digits) derived from ``seed``."""
    return f"{prefix}-{hashlib.sha256(f'{prefix}:{seed}'.encode()).hexdigest()[:17]}"


def _interfaces(doc: JsonObject, hostname: str, addresses: list[_Address]) -> tuple[str | None, Dir | None]:
    """(primary MAC, ``network/interfaces/macs`` tree); ``addresses``: the document's (``_addresses``)."""
    network = as_object(doc.get("network"))
    nics = [n for n in as_list(network.get("interfaces")) if isinstance(n, dict) and isinstance(n.get("mac"), str)]
    if not nics:
        return None, None
    bond_mac = as_object(network.get("bonding")).get("mac")
    primary = bond_mac if any(n["mac"] == bond_mac for n in nics) else nics[0]["mac"]
    vpc = _text(network.get("vpc_id")) or aws_id("vpc", _text(doc.get("project_id")) or "default")
    macs = Dir()
    for index, nic in enumerate(nics):
        mac = str(nic["mac"]).lower()
        mine = addresses if nic["mac"] == primary else []
        entry: list[tuple[str, Leaf | Dir]] = [("device-number", str(index)), ("local-hostname", hostname)]
        for key, picked in (
            ("local-ipv4s", [a.address for a in mine if a.family == 4 and not a.public]),
            ("public-ipv4s", [a.address for a in mine if a.family == 4 and a.public]),
            ("ipv6s", [a.address for a in mine if a.family == 6]),
        ):
            if picked:
                entry.append((key, "\n".join(picked)))
        entry += [("interface-id", aws_id("eni", mac)), ("mac", mac), ("vpc-id", vpc)]
        v4_private = [a.network for a in mine if a.family == 4 and not a.public and a.network]
        v6 = [a.network for a in mine if a.family == 6 and a.network]
        if v4_private:
            subnet = aws_id("subnet", f"{vpc}:{v4_private[0]}")
            entry += [("subnet-id", subnet), ("subnet-ipv4-cidr-block", v4_private[0])]
        if v6:
            entry.append(("subnet-ipv6-cidr-blocks", "\n".join(v6)))
        macs[mac] = Dir(sorted(entry))
    return str(primary).lower(), macs


def _tags(doc: JsonObject) -> Dir | None:
    split = [t.split("=", 1) for t in as_list(doc.get("tags")) if isinstance(t, str) and "=" in t]
    pairs: list[tuple[str, Leaf | Dir]] = [(k, v) for k, v in split if k and "/" not in k]
    return Dir([("instance", Dir(pairs))]) if pairs else None


def _address_items(addresses: list[_Address]) -> dict[str, Leaf | Dir]:
    """``local-ipv4``, ``public-ipv4`` and ``ipv6`` (systemd-imds reads it: its EC2 entry's public IPv6 key)."""
    items: dict[str, Leaf | Dir] = {}
    if local := _matching(addresses, 4, public=False):
        items["local-ipv4"] = local[0]
    if public := _matching(addresses, 4, public=True):
        items["public-ipv4"] = public[0]
    if v6 := _matching(addresses, 6, public=True) + _matching(addresses, 6, public=False):
        items["ipv6"] = v6[0]
    return items


def aws_meta_data(doc: JsonObject, instance_id: str | None = None, context: Context | None = None) -> Dir:
    """The ``meta-data`` tree of the AWS layout (keys in AWS's alphabetical order).

    ``instance_id`` is the record's id (default: the document's ``id``); ``context`` holds the
    notices reaching the instance (``events/``, ``spot/``, ``autoscaling/``: none on a drive).
    """
    os_ = as_object(doc.get("operating_system"))
    hostname = _text(doc.get("hostname"))
    region, zone = placement(doc)
    addresses = _addresses(doc)  # parsed once for the interfaces and the address keys
    mac, macs = _interfaces(doc, hostname, addresses)
    items: dict[str, Leaf | Dir] = {
        "ami-id": _text(os_.get("image_tag") or os_.get("slug")),
        "ami-launch-index": "0",
        "hostname": hostname,
        "instance-action": "none",
        "instance-id": _text(doc.get("id") if instance_id is None else instance_id),
        "instance-life-cycle": "spot" if isinstance(doc.get("spot"), dict) else "on-demand",
        "instance-type": _text(doc.get("plan")),
        "local-hostname": hostname,
        "public-hostname": hostname,
    }
    disks = [d for d in as_list(as_object(doc.get("storage")).get("disks")) if isinstance(d, dict) and d.get("device")]
    if disks:
        items["block-device-mapping"] = Dir([("ami", _text(disks[0]["device"])), ("root", _text(disks[0]["device"]))])
    items.update(_address_items(addresses))
    if mac and macs:
        items["mac"] = mac
        items["network"] = Dir([("interfaces", Dir([("macs", macs)]))])
    placement_items = [(k, v) for k, v in (("availability-zone", zone), ("region", region)) if v]
    if placement_items:
        items["placement"] = Dir(placement_items)
    if (keys := _public_keys(doc)) is not None:
        items["public-keys"] = keys
    if isinstance(doc.get("spot"), dict) and doc["spot"].get("termination_time"):
        items["spot"] = Dir([("termination-time", _text(doc["spot"]["termination_time"]))])
    if (tags := _tags(doc)) is not None:
        items["tags"] = tags
    if context is not None:
        items.update(ec2_items(context))
    return Dir(sorted(items.items()))


def identity_document(instance: Instance) -> bytes:
    """``dynamic/instance-identity/document``: AWS's fields, pretty-printed like AWS."""
    doc = instance.metadata or {}
    region, zone = placement(doc)
    private = _matching(_addresses(doc, networks=False), 4, public=False)
    plan = _text(doc.get("plan"))
    document = {
        "accountId": _text(doc.get("project_id") or doc.get("account_id")),
        "architecture": "arm64" if "arm" in plan.lower() else "x86_64",
        "availabilityZone": zone,
        "billingProducts": None,
        "devpayProductCodes": None,
        "marketplaceProductCodes": None,
        "imageId": _text(as_object(doc.get("operating_system")).get("image_tag")
                         or as_object(doc.get("operating_system")).get("slug")),
        "instanceId": instance.id,
        "instanceType": plan,
        "kernelId": None,
        "pendingTime": instance.metadata_updated_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        if instance.metadata_updated_at else None,
        "privateIp": private[0] if private else None,
        "ramdiskId": None,
        "region": region,
        "version": "2017-09-30",
    }
    return pretty(document).encode()  # json.dumps(indent=2)'s text from the C encoder


def version_root(instance: Instance, version: str, signer: Signer, context: Context | None = None) -> Dir:
    """Everything under ``/<version>/`` for this instance (``context``: the notices reaching it, if served live)."""
    items: list[tuple[str, Leaf | Dir]] = []
    doc = instance.metadata
    if version == HOLLOW_VERSION:
        if doc is not None:
            items.append(("meta-data", hollow_meta_data(doc, instance.id)))
    elif doc is not None:
        document = identity_document(instance)
        # Made apart from the tree (a private-key operation each: ``Later``, which the EC2 flavor queues on its
        # signing thread); one PKCS#7 for pkcs7 and rsa2048.
        pkcs7 = Later(partial(signer.pkcs7_of, document))
        identity = Dir([
            ("document", document),
            ("pkcs7", pkcs7),
            ("rsa2048", pkcs7),
            ("signature", Later(partial(signer.signature_of, document))),
        ])
        items += [("dynamic", Dir([("instance-identity", identity)])),
                  ("meta-data", aws_meta_data(doc, instance.id, context))]
    if instance.userdata is not None:
        items.append(("user-data", instance.userdata))
    return Dir(items, bare=True)


def versions_listing() -> str:
    """What ``GET /`` answers: the versions, one per line."""
    return "\n".join(VERSIONS)
