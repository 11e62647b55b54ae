"""Change watch (GCE's ``wait_for_change``): the ETag of an instance version.

The ETag names one version of the instance's canonical record (every record type, the
addresses and their update times), so it is the same on every replica and changes with
any write to the instance. It is computed once per catalog entry (``Entry.etag``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence

from imds.models import Instance
from imds.services.render.timeline import Seen

_FIELDS = tuple(field.name for field in dataclasses.fields(Instance))
_CANONICAL = json.JSONEncoder(sort_keys=True, default=str, separators=(",", ":")).encode  # made once, not per call


def instance_etag(instance: Instance) -> bytes:
    """A strong ETag (quoted) for this version of ``instance``.

    The same canonical text as ``json.dumps(dataclasses.asdict(instance), sort_keys=True,
    default=str, separators=(",", ":"))`` without ``asdict``'s deep copy of the document, which
    took two thirds of a first read's time: the fields are taken as they are, and only nested
    dataclasses (the OS record) become dicts.
    """
    fields = {name: _plain(getattr(instance, name)) for name in _FIELDS}
    return b'"' + hashlib.sha256(_CANONICAL(fields).encode()).hexdigest()[:32].encode() + b'"'


def _plain(value: object) -> object:
    """``value``, or a dict of it when it is a dataclass instance (as ``asdict`` makes)."""
    if value is not None and dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def notices_tag(notices: Sequence[Seen]) -> bytes:
    """What an instance's ETag adds for the notices reaching it: each one's id, revision and state as seen."""
    canonical = json.dumps([[n.notice.id, n.notice.revision, n.status] for n in notices], separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).digest()
