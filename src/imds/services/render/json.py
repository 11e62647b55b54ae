"""The Equinix JSON flavor: the stored metadata document plus template fields.

The document's ``host`` (``imds.models.RECORD_HOST``: where the instance runs, for the
host-key check) is the one key never served to the instance: a guest has no business knowing
its hypervisor (the admin API shows the document whole).
"""

from __future__ import annotations

import json
import math

from imds.errors import RecordNotFound
from imds.models import METADATA, RECORD_HOST, USERDATA, Instance, JsonObject
from imds.services.render.templates import Template, apply


def metadata_document(instance: Instance, templates: tuple[Template, ...], *, served: bool = False) -> JsonObject:
    """The metadata as stored, with each template field it lacks filled in.

    ``served``: the instance's own view, without ``host`` (the admin API shows it).
    """
    if instance.metadata is None:
        raise RecordNotFound(METADATA, instance.id)
    document = instance.metadata
    if served and RECORD_HOST in document:
        document = {key: value for key, value in document.items() if key != RECORD_HOST}
    return apply(document, templates)


def metadata_bytes(instance: Instance, templates: tuple[Template, ...], *, served: bool = False) -> bytes:
    """``metadata_document`` as compact UTF-8 JSON."""
    return encode(metadata_document(instance, templates, served=served))


def userdata_bytes(instance: Instance) -> bytes:
    """The userdata exactly as stored."""
    if instance.userdata is None:
        raise RecordNotFound(USERDATA, instance.id)
    return instance.userdata


def encode(document: object) -> bytes:
    """Compact JSON, non-ASCII kept as UTF-8.

    Writes refuse what JSON text cannot carry (lone surrogates, NaN, Infinity), but a
    record stored before that check still renders: such values are replaced
    (``?``, ``null``) instead of failing every read of the instance.
    """
    try:
        return json.dumps(document, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except (UnicodeEncodeError, ValueError):
        return json.dumps(_clean(document), separators=(",", ":"), ensure_ascii=False).encode()


def _clean(value: object) -> object:
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode() if not value.isascii() else value
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
