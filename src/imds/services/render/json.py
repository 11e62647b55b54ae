"""The Equinix JSON flavor: the stored metadata document plus template fields."""

from __future__ import annotations

import json

from imds.errors import RecordNotFound
from imds.models import METADATA, USERDATA, Instance, JsonObject
from imds.services.templates import Template, apply


def metadata_document(instance: Instance, templates: tuple[Template, ...]) -> JsonObject:
    """The metadata as stored, with each template field it lacks filled in."""
    if instance.metadata is None:
        raise RecordNotFound(METADATA, instance.id)
    return apply(instance.metadata, templates)


def metadata_bytes(instance: Instance, templates: tuple[Template, ...]) -> bytes:
    """``metadata_document`` as compact UTF-8 JSON."""
    return encode(metadata_document(instance, templates))


def userdata_bytes(instance: Instance) -> bytes:
    """The userdata exactly as stored."""
    if instance.userdata is None:
        raise RecordNotFound(USERDATA, instance.id)
    return instance.userdata


def encode(document: object) -> bytes:
    """Compact JSON, non-ASCII kept as UTF-8."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
