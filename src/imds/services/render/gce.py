"""The GCE flavor's tree: ``/computeMetadata/v1/`` rendered from the canonical record.

A pure function of the record, built once per version of the instance (``Entry.render``).
The tree is plain data: a ``dict`` is a directory, a list of dicts a numbered directory
(``network-interfaces/0/``), a list of strings a leaf answered one per line (``scopes``),
``Json`` a leaf answered as JSON (``tags``), a string a text leaf, and ``Dynamic`` a leaf
the web flavor answers per request (``identity``, ``token``). Mapping from the document:

| GCE path | from |
|---|---|
| instance/id, name, hostname | the record id; ``hostname`` (name: its first label) |
| instance/zone | ``projects/<number>/zones/<availability_zone or facility>`` |
| instance/machine-type | ``projects/<number>/machineTypes/<plan>`` |
| instance/tags | ``tags`` (a JSON list) |
| instance/attributes/… | ``attributes`` (an object; non-string values as compact JSON) over the derived ones |
| instance/attributes/ssh-keys | ``ssh_keys``, one per line as ``cloudinit:<key>`` (unless the key names its user) |
| instance/attributes/user-data | the userdata (base64, with ``user-data-encoding: base64``, when not UTF-8) |
| instance/network-interfaces/0/… | ``network.addresses`` and ``network.interfaces`` (bond MAC, else the first) |
| project/project-id | ``project_id`` (else ``default``) |
| project/numeric-project-id | ``project_number(project_id)`` |
| project/attributes/… | the project's record (``PUT /projects/{id}/attributes``) over ``project_attributes`` |
| instance/maintenance-event, preempted, upcoming-maintenance | the notices reaching it (``render.events``) |

``project/attributes/`` merges two sources key by key: the project's attributes record
(written once for the whole project, held by the catalog) wins over the instance
document's ``project_attributes`` object for a key both have; keys only the document has
stay. An instance without ``project_id`` is in project ``default``.

The numeric project id is stable per project and the same on every replica: the first 48
bits of SHA-256 of the project id, as a 12-digit decimal (``project_number``).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
from dataclasses import dataclass
from typing import Any

from imds.models import Instance, JsonObject, ProjectAttributes
from imds.services.render.context import NO_CONTEXT, Context
from imds.services.render.events import gce_items
from imds.services.render.fields import as_list, as_object

PREFIX = "computeMetadata"
ROOT = "/computeMetadata/v1"
DEFAULT_PROJECT = "default"
DEFAULT_SSH_USER = "cloudinit"  # the user cloud-init's GCE datasource takes keys for (besides the default user)
SCOPES = ("openid", "https://www.googleapis.com/auth/userinfo.email")
TEXT = b"application/text"
JSON = b"application/json"


@dataclass(frozen=True)
class Json:
    """A leaf answered as JSON by default (GCE's ``tags``)."""

    value: object


@dataclass(frozen=True)
class Dynamic:
    """A leaf the web flavor answers per request: ``identity`` (a token) or ``token`` (refused)."""

    name: str


IDENTITY = Dynamic("identity")
TOKEN = Dynamic("token")


def project_number(project_id: str) -> str:
    """The numeric project id of ``project_id``: 12 decimal digits from its SHA-256 (stable, replica-independent)."""
    value = int.from_bytes(hashlib.sha256(project_id.encode()).digest()[:6], "big")
    return str(10**11 + value % (9 * 10**11))


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


@dataclass(frozen=True)
class Project:
    """The project an instance belongs to: its id and number."""

    id: str
    number: str


def project_of(doc: JsonObject) -> Project:
    """The instance's project, from the document's ``project_id`` (else ``default``)."""
    project_id = _text(doc.get("project_id")) or DEFAULT_PROJECT
    return Project(project_id, project_number(project_id))


def facility_of(doc: JsonObject) -> str:
    """The facility an instance is in (notices for a facility reach it): ``facility``, else ``availability_zone``."""
    return _text(doc.get("facility") or doc.get("availability_zone"))


def zone_of(doc: JsonObject) -> str:
    """The bare zone name: ``availability_zone``, else ``facility``."""
    return _text(doc.get("availability_zone") or doc.get("facility"))


def service_account(doc: JsonObject, project: Project) -> str:
    """The default service account's email: ``service_account`` in the document, else ``<number>-compute@…``."""
    return _text(doc.get("service_account")) or f"{project.number}-compute@{project.id}.imds.internal"


def _ssh_line(key: str) -> str:
    first = key.split(None, 1)[0] if key.strip() else ""
    return key if ":" in first else f"{DEFAULT_SSH_USER}:{key}"


def instance_attributes(instance: Instance) -> dict[str, str]:
    """``instance/attributes``: the document's ``attributes`` over the derived ``ssh-keys`` and ``user-data``."""
    doc = instance.metadata or {}
    derived: dict[str, str] = {}
    keys = [k for k in as_list(doc.get("ssh_keys")) if isinstance(k, str) and k.strip()]
    if keys:
        derived["ssh-keys"] = "\n".join(_ssh_line(k) for k in keys)
    if instance.userdata is not None:
        try:
            derived["user-data"] = instance.userdata.decode()
        except UnicodeDecodeError:
            derived["user-data"] = base64.b64encode(instance.userdata).decode()
            derived["user-data-encoding"] = "base64"
    explicit = {str(k): _text(v) for k, v in as_object(doc.get("attributes")).items()}
    return dict(sorted((derived | explicit).items()))


def _interfaces(doc: JsonObject, project: Project) -> list[object]:
    network = as_object(doc.get("network"))
    private: list[str] = []
    public: list[str] = []
    v6: list[str] = []
    for item in as_list(network.get("addresses")):
        if not isinstance(item, dict) or not isinstance(item.get("address"), str):
            continue
        try:
            version = ipaddress.ip_address(item["address"]).version
        except ValueError:
            continue
        (v6 if version == 6 else public if item.get("public") is True else private).append(item["address"])
    macs = [str(n["mac"]).lower() for n in as_list(network.get("interfaces")) if isinstance(n, dict) and n.get("mac")]
    bond = _text(as_object(network.get("bonding")).get("mac")).lower()
    mac = bond if bond in macs else macs[0] if macs else ""
    if not (private or public or v6 or mac):
        return []
    nic: dict[str, object] = {
        "access-configs": [{"external-ip": ip, "type": "ONE-TO-ONE-NAT"} for ip in public[:1]],
        "ip": private[0] if private else public[0] if public else "",
        "mac": mac,
        "network": f"projects/{project.number}/networks/default",
    }
    if v6:
        nic["ipv6s"] = v6
    return [nic]


def project_attributes(doc: JsonObject, record: ProjectAttributes | None) -> dict[str, str]:
    """``project/attributes``: the project's record over the document's ``project_attributes``, key by key."""
    merged = {str(k): _text(v) for k, v in as_object(doc.get("project_attributes")).items()}
    if record is not None:
        merged.update(record.attributes)
    return dict(sorted(merged.items()))


def gce_root(
    instance: Instance, record: ProjectAttributes | None = None, context: Context = NO_CONTEXT,
) -> dict[str, object]:
    """Everything under ``/computeMetadata/v1/`` for this instance (``instance/`` and ``project/``).

    ``record``: the attributes record of the instance's project, if it has one; ``context``: the
    notices reaching it (``maintenance-event`` says ``NONE`` and ``preempted`` ``FALSE`` without).
    """
    doc = instance.metadata or {}
    project = project_of(doc)
    hostname = _text(doc.get("hostname"))
    email = service_account(doc, project)
    account: dict[str, object] = {"aliases": ["default"], "email": email, "identity": IDENTITY,
                                  "scopes": list(SCOPES), "token": TOKEN}
    tree: dict[str, object] = {
        "attributes": instance_attributes(instance),
        "hostname": hostname,
        "id": instance.id,
        "machine-type": f"projects/{project.number}/machineTypes/{_text(doc.get('plan'))}",
        "name": hostname.split(".", 1)[0],
        "network-interfaces": _interfaces(doc, project),
        "service-accounts": {"default": account, email: account},
        "tags": Json([_text(t) for t in as_list(doc.get("tags"))]),
        "zone": f"projects/{project.number}/zones/{zone_of(doc)}",
    }
    for key, value in gce_items(context).items():
        tree[key] = Json(value) if isinstance(value, dict) else value
    tree = dict(sorted(tree.items()))
    project_tree: dict[str, object] = {
        "attributes": project_attributes(doc, record),
        "numeric-project-id": project.number,
        "project-id": project.id,
    }
    return {"instance": tree, "project": project_tree}


def find(root: dict[str, object], parts: list[str]) -> object | None:
    """The node at ``parts`` (list items by index), or None."""
    node: object = root
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node) and _is_dir(node):
            node = node[int(part)]
        else:
            return None
    return node


def _is_dir(node: object) -> bool:
    return isinstance(node, dict) or (isinstance(node, list) and all(isinstance(i, dict) for i in node) and bool(node))


def _entries(node: dict[str, object] | list[object]) -> list[tuple[str, object]]:
    return list(node.items()) if isinstance(node, dict) else [(str(i), v) for i, v in enumerate(node)]


def _camel(key: str) -> str:
    head, *rest = key.split("-")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def as_json(node: object, *, verbatim: bool = False) -> object:
    """A node as GCE's recursive JSON: camelCase keys (attributes kept verbatim), no per-request leaves."""
    if isinstance(node, dict):
        return {(k if verbatim else _camel(k)): as_json(v, verbatim=k == "attributes")
                for k, v in node.items() if not isinstance(v, Dynamic)}
    if isinstance(node, list):
        return [as_json(item) for item in node]
    if isinstance(node, Json):
        return node.value
    return node


def _leaf_text(node: object) -> str:
    if isinstance(node, Json):
        return json.dumps(node.value, separators=(",", ":"))
    if isinstance(node, list):
        return "".join(f"{item}\n" for item in node)
    return str(node)


def _text_lines(node: object, prefix: str) -> list[str]:
    if not _is_dir(node):
        return [f"{prefix} {_leaf_text(node)}".lstrip()] if not isinstance(node, Dynamic) else []
    assert isinstance(node, dict | list)  # noqa: S101 - _is_dir said so (narrows for mypy)
    return [line for key, child in _entries(node) for line in _text_lines(child, f"{prefix}/{key}".lstrip("/"))]


def answer(node: object, *, recursive: bool, alt: str | None, verbatim: bool = False) -> tuple[bytes, bytes]:
    """(body, content type) of a GET of ``node`` with ``?recursive`` and ``?alt=json|text``.

    ``verbatim``: ``node`` is an ``attributes`` directory (its keys are not camelCased).
    """
    if _is_dir(node):
        assert isinstance(node, dict | list)  # noqa: S101 - _is_dir said so (narrows for mypy)
        if recursive and alt != "text":
            return json.dumps(as_json(node, verbatim=verbatim), separators=(",", ":")).encode(), JSON
        if recursive:
            return "".join(f"{line}\n" for line in _text_lines(node, "")).encode(), TEXT
        names = [f"{key}/" if _is_dir(child) else key for key, child in _entries(node)]
        if alt == "json":
            return json.dumps(names).encode(), JSON
        return "".join(f"{name}\n" for name in names).encode(), TEXT
    if alt == "json" or (isinstance(node, Json) and alt != "text"):
        return json.dumps(as_json(node), separators=(",", ":")).encode(), JSON
    return _leaf_text(node).encode(), TEXT


def identity_claims(instance: Instance, audience: str, *, full: bool) -> dict[str, object]:
    """The claims of an identity token for ``instance`` (``iss``, ``iat`` and ``exp`` are the signer's)."""
    doc = instance.metadata or {}
    project = project_of(doc)
    email = service_account(doc, project)
    claims: dict[str, object] = {"aud": audience, "azp": email, "sub": instance.id}
    if full:
        claims["email"] = email
        claims["email_verified"] = True
        hostname = _text(doc.get("hostname"))
        claims["google"] = {"compute_engine": {
            "instance_id": instance.id,
            "instance_name": hostname.split(".", 1)[0],
            "project_id": project.id,
            "project_number": int(project.number),
            "zone": zone_of(doc),
        }}
    return claims


def gce_in_context(instance: Instance, context: Context) -> dict[str, object]:
    """``gce_root`` with the context's project record and notices (what the GCE flavor serves)."""
    return gce_root(instance, context.project, context)
