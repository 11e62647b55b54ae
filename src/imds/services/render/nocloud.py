"""The NoCloud flavor: what cloud-init's NoCloud (seed ISO) and NoCloud-Net (``seedfrom``) read.

- ``meta-data``: YAML with ``instance-id``, ``local-hostname`` and ``public-keys`` (``ssh_keys``).
- ``user-data``: the userdata bytes; empty when there is none (always present).
- ``vendor-data``: the ``cloud-init`` member of ``vendor_data`` when it is a string (as
  cloud-init reads OpenStack vendor data), else empty.
- ``network-config``: network config v2 from ``network_data`` (or the Equinix ``network``
  section); absent when that describes no link.
"""

from __future__ import annotations

from typing import Any

import yaml

from imds.models import Instance
from imds.services.render.network import network_config_v2, network_data
from imds.services.render.openstack import public_keys, vendor_data
from imds.services.render.tree import Dir, Leaf, text_bytes

META_DATA = "meta-data"
USER_DATA = "user-data"
VENDOR_DATA = "vendor-data"
NETWORK_CONFIG = "network-config"


def _yaml(value: Any) -> bytes:
    # No line folding: one key per line, as people write seed files by hand.
    return yaml.safe_dump(value, sort_keys=False, allow_unicode=True, width=1 << 20).encode()


def nocloud_tree(instance: Instance) -> Dir:
    """The NoCloud files, in the order cloud-init documents them."""
    doc = instance.metadata or {}
    meta = {
        "instance-id": instance.id,
        "local-hostname": str(doc.get("hostname") or ""),
        "public-keys": public_keys(doc),
    }
    vendor = vendor_data(doc).get("cloud-init")
    items: list[tuple[str, Leaf | Dir]] = [
        (META_DATA, _yaml(meta)),
        (USER_DATA, instance.userdata or b""),
        (VENDOR_DATA, text_bytes(vendor) if isinstance(vendor, str) else b""),
    ]
    network = network_config_v2(network_data(doc))
    if network is not None:
        items.append((NETWORK_CONFIG, _yaml(network)))
    return Dir(items)
