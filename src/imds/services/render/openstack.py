"""The OpenStack flavor: ``/openstack/<version>/…`` as Nova serves it, from the canonical record.

Versions and what each adds follow Nova's ``nova/api/metadata/base.py``; a field or file
appears only from the version that introduced it (``latest`` is the newest version):

| version | adds |
|---|---|
| 2012-08-10 | ``meta_data.json`` (uuid, meta, public_keys, keys, hostname, name, launch_index, |
|            | availability_zone), ``user_data`` |
| 2013-04-04 | ``random_seed`` (fresh per request), ``password`` |
| 2013-10-17 | ``vendor_data.json`` |
| 2015-10-15 | ``project_id``, ``network_data.json`` |
| 2016-06-30 | ``devices`` (device role tags) |
| 2016-10-06 | ``vendor_data2.json`` (``{"static": vendor_data}``) |
| 2017-02-22 | ``devices[].vlan`` |
| 2018-08-27 | ``devices[].vf_trusted`` |
| 2020-10-14 | ``dedicated_cpus`` |
| 2025-04-04 | (nothing new here: Nova's share devices) |

Mapping from the Equinix-shaped document: ``uuid`` is the instance id; ``hostname`` and
``name`` (``name``, else ``hostname``); ``availability_zone`` (``availability_zone``, else
``facility``); ``public_keys``/``keys`` from ``ssh_keys`` (named by the key's comment, made
unique); ``meta`` from ``key=value`` tags plus an explicit ``meta`` object (which wins);
``project_id``, ``launch_index`` (default 0) and ``dedicated_cpus`` when the document has
them; ``devices``, ``network_data`` and ``vendor_data`` from the document's OpenStack parts
(see ``imds.services.records.parts``; ``network_data.json`` is derived from ``network`` otherwise).

``meta_data.json`` leaves are ``SeededJson``: the document is rendered (and cached) once,
and whoever serves it splices a fresh ``random_seed`` in with ``with_seed``.
"""

from __future__ import annotations

import binascii
from typing import Any

from imds.models import Instance, JsonObject
from imds.services.render.ec2 import placement
from imds.services.render.fields import as_list, as_object
from imds.services.render.json import encode
from imds.services.render.network import network_data
from imds.services.render.tree import Dir, Leaf

FOLSOM, GRIZZLY, HAVANA, LIBERTY = "2012-08-10", "2013-04-04", "2013-10-17", "2015-10-15"
NEWTON_ONE, NEWTON_TWO, OCATA, ROCKY = "2016-06-30", "2016-10-06", "2017-02-22", "2018-08-27"
VICTORIA, EPOXY = "2020-10-14", "2025-04-04"
DATED_VERSIONS = (FOLSOM, GRIZZLY, HAVANA, LIBERTY, NEWTON_ONE, NEWTON_TWO, OCATA, ROCKY, VICTORIA, EPOXY)
LATEST = "latest"
VERSIONS = (*DATED_VERSIONS, LATEST)

META_DATA = "meta_data.json"
USER_DATA = "user_data"
PASSWORD = "password"  # noqa: S105 - a file name, not a secret
VENDOR_DATA = "vendor_data.json"
NETWORK_DATA = "network_data.json"
VENDOR_DATA2 = "vendor_data2.json"
NOTICES = "notices.json"  # imds's own, not Nova's: the lifecycle notices (``latest`` only, unlisted, never on a drive)
class SeededJson(bytes):
    """A JSON object's bytes, served with a ``random_seed`` spliced in as its last member."""

    def with_seed(self, seed: bytes) -> bytes:
        """The document with ``"random_seed": base64(seed)`` added."""
        return splice(self.opening(), binascii.b2a_base64(seed, newline=False))

    def opening(self) -> bytes:
        """The document up to its seed's base64 text: every member, then ``,"random_seed":"``."""
        return bytes(self[:-1]) + b',"random_seed":"'


def splice(opening: bytes, seed_text: bytes) -> bytes:
    """A seeded document from its ``SeededJson.opening`` and the seed's base64 text: that text, then ``"}``."""
    return b"".join((opening, seed_text, b'"}'))


def since(version: str, introduced: str) -> bool:
    """Whether ``version`` (a dated version or ``latest``) has what ``introduced`` added."""
    effective = DATED_VERSIONS[-1] if version == LATEST else version
    return DATED_VERSIONS.index(effective) >= DATED_VERSIONS.index(introduced)


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def key_names(keys: list[str]) -> list[str]:
    """A unique name per key: its comment (``ssh-ed25519 AAAA… me@host`` → ``me@host``), else ``key-N``."""
    names: list[str] = []
    for index, key in enumerate(keys):
        parts = key.split()
        name = parts[2] if len(parts) > 2 else f"key-{index}"
        while name in names:
            name = f"{name}-{index}"
        names.append(name)
    return names


def public_keys(doc: JsonObject) -> list[str]:
    """The document's SSH public keys (``ssh_keys``), blanks dropped."""
    return [k for k in as_list(doc.get("ssh_keys")) if isinstance(k, str) and k.strip()]


def _meta(doc: JsonObject) -> dict[str, str]:
    pairs = [t.split("=", 1) for t in as_list(doc.get("tags")) if isinstance(t, str) and "=" in t]
    meta = {key: value for key, value in pairs if key}
    meta.update({str(k): _text(v) for k, v in as_object(doc.get("meta")).items()})
    return meta


def devices(doc: JsonObject, version: str) -> list[JsonObject]:
    """The device role tags as ``version`` shows them (``vlan`` and ``vf_trusted`` only once introduced)."""
    hidden = set()
    if not since(version, OCATA):
        hidden.add("vlan")
    if not since(version, ROCKY):
        hidden.add("vf_trusted")
    return [{k: v for k, v in d.items() if k not in hidden} for d in as_list(doc.get("devices")) if isinstance(d, dict)]


def meta_data_document(instance: Instance, version: str) -> JsonObject:
    """``meta_data.json`` for ``version``, without ``random_seed`` (added when served)."""
    doc = instance.metadata or {}
    hostname = _text(doc.get("hostname"))
    md: JsonObject = {"uuid": instance.id}
    if meta := _meta(doc):
        md["meta"] = meta
    keys = public_keys(doc)
    if keys:
        names = key_names(keys)
        md["public_keys"] = dict(zip(names, keys, strict=True))
        md["keys"] = [{"name": n, "type": "ssh", "data": k} for n, k in zip(names, keys, strict=True)]
    md["hostname"] = hostname
    md["name"] = _text(doc.get("name")) or hostname
    launch_index = doc.get("launch_index")
    md["launch_index"] = launch_index if isinstance(launch_index, int) else 0
    md["availability_zone"] = placement(doc)[1]
    if since(version, LIBERTY):
        md["project_id"] = _text(doc.get("project_id"))
    if since(version, NEWTON_ONE):
        md["devices"] = devices(doc, version)
    if since(version, VICTORIA):
        md["dedicated_cpus"] = [c for c in as_list(doc.get("dedicated_cpus")) if isinstance(c, int)]
    return md


def meta_data(instance: Instance, version: str) -> bytes:
    """``meta_data.json`` bytes; ``SeededJson`` from 2013-04-04 on (a seed is spliced in when served)."""
    encoded = encode(meta_data_document(instance, version))
    return SeededJson(encoded) if since(version, GRIZZLY) else encoded


def vendor_data(doc: JsonObject) -> JsonObject:
    """``vendor_data.json``: the document's ``vendor_data`` object, else ``{}``."""
    return as_object(doc.get("vendor_data"))


def version_dir(instance: Instance, version: str) -> Dir:
    """Everything under ``/openstack/<version>/``, in Nova's listing order (``password`` included)."""
    doc = instance.metadata or {}
    items: list[tuple[str, Leaf | Dir]] = [(META_DATA, meta_data(instance, version))]
    if instance.userdata is not None:
        items.append((USER_DATA, instance.userdata))
    if since(version, GRIZZLY):
        items.append((PASSWORD, instance.password or b""))
    if since(version, HAVANA):
        items.append((VENDOR_DATA, encode(vendor_data(doc))))
    if since(version, LIBERTY):
        items.append((NETWORK_DATA, encode(network_data(doc))))
    if since(version, NEWTON_TWO):
        items.append((VENDOR_DATA2, encode({"static": vendor_data(doc)})))
    return Dir(items)


def versions_listing() -> str:
    """What ``GET /openstack`` answers: every version, one per line, ``latest`` last."""
    return "\n".join(VERSIONS)
