"""``imds explain`` / ``GET /explain``: why an address gets an instance's metadata, and what each flavor serves.

For an address: the stored entry it resolves through (host or CIDR, longest prefix), every
other entry that also contains it, what the upstream lookup did (its by-IP cache and the
kinds it fetched; a server only: the caches live in its memory), and a short preview of
each flavor for the instance. For an instance id: its entries and the previews. Private
and secret Ganeti values are masked; nothing here reveals one.

::

    explanation = explain_address(address, catalog.containing(address), instances.get, templates=t)
    explanation = await Explainer(store, catalog, templates, lookup).explain("10.0.0.5")  # a server's answer
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

from imds.models import PRIVATE, PUBLIC, SECRET, Address, Instance, Network, covered
from imds.services.catalog.addresses import AddressIndex, display
from imds.services.catalog.catalog import Catalog
from imds.services.ganeti.records import active
from imds.services.lookup.pull import Lookup
from imds.services.records.wire import parse_instance_id
from imds.services.render.ec2 import aws_meta_data
from imds.services.render.json import metadata_bytes
from imds.services.render.nocloud import nocloud_tree
from imds.services.render.openstack import meta_data_document
from imds.services.render.templates import Template
from imds.services.render.tree import body, resolve
from imds.services.transfer.readout import InstanceNotStored
from imds.store import Store

PREVIEW_BYTES = 200
MASKED = {PRIVATE: "<private>", SECRET: "<secret>"}


def entry(network: Network, instance_id: str) -> dict[str, Any]:
    """One stored address entry as shown (as sent; ``covers``: the network an address with a prefix covers)."""
    host = network.prefixlen == network.max_prefixlen
    shown = {"entry": display(network), "kind": "host" if host else "cidr", "prefix": network.prefixlen,
             "instance_id": instance_id}
    covers = covered(network)
    if covers is not None:
        shown["covers"] = covers
    return shown


def _as_stored(entries: list[tuple[Network, str]], instance: Callable[[str], Instance | None],
               ) -> list[tuple[Network, str]]:
    """``entries`` (networks as the index holds them) with each network as its holder stored it (as sent)."""
    spelled = []
    for network, holder in entries:
        found = instance(holder)
        stored = next((a for a in found.addresses if a == network), network) if found is not None else network
        spelled.append((stored, holder))
    return spelled


def explain_address(
    address: Address, entries: list[tuple[Network, str]], instance: Callable[[str], Instance | None], *,
    templates: tuple[Template, ...], upstream: dict[str, Any] | None,
) -> dict[str, Any]:
    """The explanation for ``address``; ``entries`` is every stored entry containing it, longest first.

    ``upstream`` is what the lookup did (None: unknown here; without ``by_ip_cache``: no
    lookup configured). No instance holding the address is an answer, not an error: ``why``
    says so.
    """
    entries = _as_stored(entries, instance)
    matched = entry(*entries[0]) if entries else None
    instance_id = matched["instance_id"] if matched else None
    how = "stored entry" if matched else None
    cached = (upstream or {}).get("by_ip_cache")
    if instance_id is None and cached:
        instance_id, how = next(iter(cached.values())), "upstream lookup (by-IP cache)"
    found = instance(instance_id) if instance_id is not None else None
    return {
        "query": str(address),
        "instance_id": instance_id,
        "resolved_by": how,
        **({} if instance_id is not None else {"why": _nobody(address, upstream_known=cached is not None)}),
        "matched": matched,
        "also_containing": [entry(network, holder) for network, holder in entries[1:]],
        "upstream": upstream if upstream is not None else {"known": False,
                                                         "why": "the lookup caches live in a server's memory: "
                                                                "ask one with --url"},
        "instance": summary(found) if found is not None else None,
        "previews": previews(found, templates) if found is not None else {},
    }


def _nobody(address: Address, *, upstream_known: bool) -> str:
    upstream = " and the upstream lookup has not answered for it" if upstream_known else ""
    return f"no stored entry contains it{upstream}: no instance holds {address}"


def explain_instance(
    found: Instance, *, templates: tuple[Template, ...], upstream: dict[str, Any] | None,
) -> dict[str, Any]:
    """The explanation for an instance id: its entries and what each flavor serves."""
    return {
        "query": found.id,
        "instance_id": found.id,
        "resolved_by": "instance id",
        "matched": None,
        "also_containing": [],
        "upstream": upstream if upstream is not None else {"known": False},
        "instance": summary(found),
        "previews": previews(found, templates),
    }


def summary(found: Instance) -> dict[str, Any]:
    """Id, hostname, entries and which records exist."""
    hostname = found.metadata.get("hostname") if found.metadata is not None else None
    return {
        "id": found.id,
        "hostname": hostname if isinstance(hostname, str) else None,
        "entries": [entry(network, found.id) for network in found.addresses],
        "metadata": found.metadata is not None,
        "userdata_bytes": len(found.userdata) if found.userdata is not None else None,
        "os": found.os is not None,
    }


def previews(found: Instance, templates: tuple[Template, ...]) -> dict[str, Any]:
    """A short preview of what each flavor returns to the instance (None: the flavor serves nothing)."""
    doc = found.metadata
    shown: dict[str, Any] = {"json": None, "ec2": None, "openstack": None, "nocloud": None, "ganeti": None}
    if doc is not None:
        shown["json"] = _clip(metadata_bytes(found, templates, served=True))
        tree = aws_meta_data(doc, found.id)
        shown["ec2"] = {key: _leaf(tree, key) for key in ("instance-id", "local-ipv4", "hostname")}
        openstack = meta_data_document(found, "latest")
        shown["openstack"] = {key: openstack.get(key) for key in ("uuid", "name", "hostname")}
    if doc is not None or found.userdata is not None:
        shown["nocloud"] = _leaf(nocloud_tree(found), "meta-data")
    if found.os is not None:
        record = found.os
        params = dict(record.parameters)
        if record.mode in {"install", "self_install"}:
            params.update(record.install_parameters)
        shown["ganeti"] = {
            "served": active(record), "os_type": record.os_type, "mode": record.mode,
            "parameters.json": {
                name: [param.value if param.visibility == PUBLIC else MASKED[param.visibility],
                       param.visibility]
                for name, param in params.items()
            },
        }
    return shown


def _leaf(tree: Any, path: str) -> str | None:
    node = resolve(tree, path)
    return None if node is None else _clip(body(node))


def _clip(data: bytes) -> str:
    text = data[:PREVIEW_BYTES].decode(errors="replace")
    return text + ("…" if len(data) > PREVIEW_BYTES else "")


def parse_query(text: str) -> Address | str:
    """An IP address, or a canonical instance id; InvalidInput naming ``query`` otherwise."""
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return parse_instance_id(text.strip(), "query")
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def explain_snapshot(
    instances: list[Instance], query: Address | str, *, templates: tuple[Template, ...],
) -> dict[str, Any]:
    """The explanation from a store snapshot (``imds explain --db``): no upstream caches here."""
    by_id = {found.id: found for found in instances}
    if isinstance(query, str):
        found = by_id.get(query)
        if found is None:
            raise InstanceNotStored(query)
        return explain_instance(found, templates=templates, upstream=None)
    index = AddressIndex()
    for found in instances:
        index.assign(found.id, found.addresses)
    return explain_address(query, index.containing(query), by_id.get, templates=templates, upstream=None)


class Explainer:
    """A server's explanations: the catalog's entries, the addresses as stored, and the lookup's caches."""

    def __init__(self, store: Store, catalog: Catalog, templates: tuple[Template, ...],
                 lookup: Lookup | None = None) -> None:
        self._store = store
        self._catalog = catalog
        self._templates = templates
        self._lookup = lookup

    async def explain(self, query: str) -> dict[str, Any]:
        """The explanation for ``query`` (an address or an instance id); InvalidInput or InstanceNotStored."""
        parsed = parse_query(query)
        lookup = self._lookup
        if isinstance(parsed, str):
            held = self._catalog.get(parsed)
            # the addresses as sent (the index holds networks)
            found = await self._store.get(parsed) or (held.instance if held is not None else None)
            if found is None:
                raise InstanceNotStored(parsed)
            upstream = lookup.provenance(None, parsed) if lookup is not None else None
            return explain_instance(found, templates=self._templates, upstream=upstream or {"configured": False})
        entries = self._catalog.containing(parsed)
        holder = entries[0][1] if entries else None
        upstream = lookup.provenance(parsed, holder) if lookup is not None else {"configured": False}
        stored = await self._store.get_many({held_by for _, held_by in entries})

        def instance(instance_id: str) -> Instance | None:
            if instance_id in stored:
                return stored[instance_id]
            held = self._catalog.get(instance_id)
            return held.instance if held is not None else None

        return explain_address(parsed, entries, instance, templates=self._templates, upstream=upstream)
