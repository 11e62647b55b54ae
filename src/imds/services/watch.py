"""Change watch (GCE's ``wait_for_change``): the ETag of an instance version.

The ETag names one version of the instance's canonical record (every record type, the
addresses and their update times), so it is the same on every replica and changes with
any write to the instance. It is computed once per catalog entry (``Entry.etag``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from imds.models import Instance


def instance_etag(instance: Instance) -> bytes:
    """A strong ETag (quoted) for this version of ``instance``."""
    canonical = json.dumps(dataclasses.asdict(instance), sort_keys=True, default=str, separators=(",", ":"))
    return b'"' + hashlib.sha256(canonical.encode()).hexdigest()[:32].encode() + b'"'
