"""The ``instance_os`` document: an ``OsRecord`` as JSON, and back.

Secrets never reach this module with a value: ``StoredParam`` has none for them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from imds.models import JsonObject, OsRecord, StoredParam


def _params_out(params: dict[str, StoredParam]) -> JsonObject:
    out: JsonObject = {}
    for name, param in params.items():
        entry: JsonObject = {"visibility": param.visibility}
        if param.value is not None:
            entry["value"] = param.value
        if param.encrypted:
            entry["encrypted"] = True
        out[name] = entry
    return out


def _params_in(raw: Any) -> dict[str, StoredParam]:
    return {
        str(name): StoredParam(str(entry["visibility"]), entry.get("value"), bool(entry.get("encrypted", False)))
        for name, entry in dict(raw or {}).items()
    }


def os_document(record: OsRecord) -> JsonObject:
    """The JSON document stored for ``record``."""
    return {
        "os_type": record.os_type,
        "mode": record.mode,
        "communication": record.communication,
        "parameters": _params_out(record.parameters),
        "install_parameters": _params_out(record.install_parameters),
        "package_url": record.package_url,
        "package_auth": record.package_auth,
        "generation": record.generation,
        "updated_at": record.updated_at.isoformat() if record.updated_at is not None else None,
    }


def os_record(document: JsonObject) -> OsRecord:
    """The ``OsRecord`` a stored document describes."""
    stamp = document.get("updated_at")
    return OsRecord(
        os_type=str(document["os_type"]),
        mode=str(document["mode"]),
        communication=bool(document["communication"]),
        parameters=_params_in(document.get("parameters")),
        install_parameters=_params_in(document.get("install_parameters")),
        package_url=document.get("package_url"),
        package_auth=bool(document.get("package_auth", False)),
        generation=str(document["generation"]),
        updated_at=datetime.fromisoformat(stamp) if isinstance(stamp, str) else None,
    )
