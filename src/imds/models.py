"""Domain values shared by every layer: no ORM types, no HTTP types."""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, ClassVar, Self

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class SpelledIPv4Network(ipaddress.IPv4Network):
    """A network written as an address inside it plus a prefix, as Equinix lists them (``10.70.17.9/31``).

    It covers (and equals, and hashes as) the network it names (``10.70.17.8/31``), but shows
    and is stored as sent: ``str()`` is the text that was written.
    """

    def __init__(self, text: str) -> None:
        """The network ``text`` names (host bits allowed), remembering ``text``."""
        super().__init__(text, strict=False)
        self.sent = text

    def __str__(self) -> str:
        """The text as sent."""
        return self.sent


class SpelledIPv6Network(ipaddress.IPv6Network):
    """``SpelledIPv4Network`` for IPv6 (``2604:1380:4641:1f00::9/127``)."""

    def __init__(self, text: str) -> None:
        """The network ``text`` names (host bits allowed), remembering ``text``."""
        super().__init__(text, strict=False)
        self.sent = text

    def __str__(self) -> str:
        """The text as sent."""
        return self.sent


def stored_network(text: str) -> Network:
    """A stored address text → its network: a host, a CIDR, or an address with a prefix (kept as spelled)."""
    v6 = ":" in text
    try:  # the class picked up front: an IPv6 row skips a failed IPv4 parse
        return ipaddress.IPv6Network(text) if v6 else ipaddress.IPv4Network(text)
    except ValueError:  # host bits set: stored as sent
        return SpelledIPv6Network(text) if v6 else SpelledIPv4Network(text)


@functools.lru_cache(maxsize=4096)  # a batch names each address a few times
def network_key(network: Network) -> str:
    """The network an address names, however it is spelled (``10.70.17.8/31`` for ``10.70.17.9/31``).

    Two addresses with one key are one address: one instance holds it. Memoised (a spelled
    network equals and hashes as the network it names, so both spellings share one entry).
    """
    return f"{network.network_address}/{network.prefixlen}"


def covered(network: Network) -> str | None:
    """The network a spelled address covers (``10.70.17.8/31`` for ``10.70.17.9/31``); None for plain ones."""
    if isinstance(network, SpelledIPv4Network | SpelledIPv6Network):
        return f"{network.network_address}/{network.prefixlen}"
    return None
JsonObject = dict[str, Any]

METADATA = "metadata"
USERDATA = "userdata"
# The metadata document's key naming the host an instance runs on (as Nova's instance.host): set
# by the source of truth, checked against host-signed proxy claims, never served to the instance.
RECORD_HOST = "host"
RECORD_KINDS = (METADATA, USERDATA)


@dataclass(frozen=True)
class Instance:
    """The canonical record of one instance, as the store holds it.

    ``addresses`` are normalised networks (a host address is a /32 or /128), or an address
    with a prefix kept as sent (``SpelledIPv4Network``: ``10.70.17.9/31`` covering ``10.70.17.8/31``).
    ``metadata`` and ``userdata`` are ``None`` when that record type is absent.
    """

    id: str
    addresses: tuple[Network, ...] = ()
    metadata: JsonObject | None = None
    metadata_updated_at: datetime | None = None
    userdata: bytes | None = None
    userdata_updated_at: datetime | None = None
    password: bytes | None = None  # OpenStack: posted once by the instance, cleared by an admin
    os: OsRecord | None = None  # Ganeti OS installation (secrets are never here: see services/ganeti/memory.py)


@dataclass(frozen=True)
class MetadataWrite:
    """A full-replacement write of an instance's metadata and address list."""

    id: str
    addresses: tuple[Network, ...]
    metadata: JsonObject


@dataclass(frozen=True)
class UserdataWrite:
    """A full-replacement write of an instance's userdata and address list."""

    id: str
    addresses: tuple[Network, ...]
    userdata: bytes


@dataclass(frozen=True)
class WriteResult:
    """What a write did.

    ``applied`` is False when the staleness guard refused it (nothing changed).
    ``moved`` maps each address taken from another instance to that instance's id.
    ``dropped`` lists this instance's addresses that the write removed.
    """

    instance_id: str
    applied: bool
    addresses: tuple[Network, ...] = ()
    moved: dict[Network, str] = field(default_factory=dict)
    dropped: tuple[Network, ...] = ()
    reason: str | None = None
    warnings: tuple[str, ...] = ()  # e.g. an address inside a trusted-proxy network


@dataclass(frozen=True)
class Change:
    """One entry of the change feed: instance ``instance_id`` changed at ``seq`` (or a project: ``project``)."""

    seq: int
    instance_id: str  # the key as stored: an instance id, or a ``ProjectKey``'s or ``NoticeKey``'s text

    @property
    def project(self) -> ProjectKey | None:
        """The project whose attributes changed, or None."""
        return ProjectKey.parse(self.instance_id)

    @property
    def notice(self) -> NoticeKey | None:
        """The notice that changed, or None."""
        return NoticeKey.parse(self.instance_id)


@dataclass(frozen=True)
class Principal:
    """Who is calling the admin API, and what they may do."""

    subject: str
    scopes: frozenset[str]


# --- Ganeti OS parameters ---------------------------------------------------------------

OS_KIND = "os"
PUBLIC, PRIVATE, SECRET = "public", "private", "secret"
VISIBILITIES = (PUBLIC, PRIVATE, SECRET)
OS_MODES = ("run", "install", "self_install")


@dataclass(frozen=True)
class StoredParam:
    """One OS parameter as the store holds it.

    ``value`` is the public value, the private value (ciphertext when ``encrypted``), or
    None for a secret, whose value lives only in process memory.
    """

    visibility: str
    value: str | None = None
    encrypted: bool = False


@dataclass(frozen=True)
class OsRecord:
    """The stored OS record of one instance. ``generation`` changes on every write.

    Secrets (and the package credentials) are held in memory under the generation that
    carried them, so a replica never serves a secret from an older write.
    """

    os_type: str
    mode: str
    communication: bool
    parameters: dict[str, StoredParam]
    install_parameters: dict[str, StoredParam]
    package_url: str | None
    package_auth: bool
    generation: str
    updated_at: datetime | None = None  # the body's updated_at (the staleness guard), if it carried one


@dataclass(frozen=True)
class Event:
    """One report an instance posted (``/events``, ``/phone-home``, ``/ganeti/<v>/write``).

    ``cursor`` increases with every event of an instance, in the order they committed;
    ``GET /device-events/{id}?after=CURSOR`` pages on it.
    """

    cursor: int
    instance_id: str
    state: str
    code: int | None
    message: str | None
    created_at: datetime


# --- the audit log (services/records/audit.py) ---------------------------------------------------------


@dataclass(frozen=True)
class AuditEvent:
    """One admin change, as written inside the change's own transaction.

    ``detail`` holds facts only: addresses moved (address → previous instance), addresses
    dropped, counts, OS type and mode. Never a document, userdata, password or parameter value.
    """

    subject: str
    instance_id: str
    action: str  # "write" or "delete"
    kind: str  # metadata, userdata, os, password
    applied: bool
    detail: JsonObject


@dataclass(frozen=True)
class AuditEntry:
    """A stored ``AuditEvent`` with its cursor (``seq``, increasing) and time."""

    seq: int
    at: datetime
    event: AuditEvent


# --- GCE project attributes (services/records/projects.py) -------------------------------------------

PROJECT_KIND = "project"
PROJECT_FEED_PREFIX = "project:"  # a change-feed (and audit) id naming a project: instance ids are UUIDs


@dataclass(frozen=True)
class ProjectAttributes:
    """A project's attributes (GCE's ``project/attributes/``), written once for every instance of the project.

    ``revision`` counts the writes of this project's record (1 for the first); it is part of
    the GCE ETag of the project's instances, so their watches see each change.
    """

    project_id: str
    attributes: dict[str, str]
    revision: int
    updated_at: datetime


# --- lifecycle notices the host sends to its guests (services/notices/) -------------------------

NOTICE_KIND = "notice"  # the audit kind and the admin scopes' kind (metadata:create:notice ...)
NOTICE_FEED_PREFIX = "notice:"  # a change-feed (and audit) id naming a notice
INSTANCE_SCOPE, PROJECT_SCOPE, FACILITY_SCOPE = "instance", "project", "facility"
NOTICE_SCOPES = (INSTANCE_SCOPE, PROJECT_SCOPE, FACILITY_SCOPE)
# Interruptions (EC2's spot/instance-action actions), scheduled events, signals, and the ASG lifecycle state.
NOTICE_KINDS = ("stop", "terminate", "hibernate", "preemption", "reboot", "maintenance", "migrate", "rebalance",
                "lifecycle")
SCHEDULED, ACTIVE, CANCELED, COMPLETED = "scheduled", "active", "canceled", "completed"
NOTICE_STATES = (SCHEDULED, ACTIVE, CANCELED, COMPLETED)


@dataclass(frozen=True)
class NoticeDraft:
    """What a notice says, before it is stored (a ``POST /device-notices`` body): a Notice without its id and times.

    It belongs to one instance, a project (every instance whose record has that ``project_id``)
    or a facility (every instance in it): ``scope`` and ``target``. ``time`` is when it takes
    effect (a maintenance window's start), ``window_end`` the end of a window. ``state`` is the
    stored one; what guests see also follows the clock (``imds.services.render.timeline``).
    ``target_state`` is the Auto Scaling target lifecycle state of a ``lifecycle`` notice.
    """

    scope: str
    target: str
    kind: str
    time: datetime
    state: str = SCHEDULED
    window_end: datetime | None = None
    description: str = ""
    target_state: str | None = None


@dataclass(frozen=True, kw_only=True)
class Notice(NoticeDraft):
    """What the host tells a guest is about to happen to it: one record, rendered by every flavor.

    A stored ``NoticeDraft`` (its fields positional, these by name): ``revision`` counts the
    notice's writes (1 for the first).
    """

    id: str
    revision: int = 1
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @classmethod
    def of(cls, draft: NoticeDraft, **stored: Any) -> Notice:
        """``draft`` as stored: ``stored`` names ``id`` and any of ``revision``, the times, a new ``state``."""
        return cls(**{**{f.name: getattr(draft, f.name) for f in fields(NoticeDraft)}, **stored})


@dataclass(frozen=True)
class Acknowledgement:
    """A guest's acknowledgement of a notice (posted through the instance<->host channel); the first one counts."""

    notice_id: str
    instance_id: str
    at: datetime


@dataclass(frozen=True)
class SideKey:
    """A change-feed (and audit) key naming a record kept beside the instances; an instance's key is its id.

    Stored as the text ``<PREFIX><id>`` (``str()``): instance ids are UUIDs, so the two never
    meet. ``parse`` reads a stored key back (None when it is not of this kind).
    """

    PREFIX: ClassVar[str] = ""
    id: str

    def __str__(self) -> str:
        return self.PREFIX + self.id

    @classmethod
    def parse(cls, key: str) -> Self | None:
        """The key ``key`` stores, or None when it names something else (an instance id)."""
        return cls(key[len(cls.PREFIX):]) if key.startswith(cls.PREFIX) else None


class ProjectKey(SideKey):
    """A GCE project's attributes: ``project:<id>``."""

    PREFIX = PROJECT_FEED_PREFIX


class NoticeKey(SideKey):
    """A lifecycle notice: ``notice:<id>``."""

    PREFIX = NOTICE_FEED_PREFIX


ChangeKey = str | ProjectKey | NoticeKey  # what a change-feed entry names: an instance (by id), a project, a notice
