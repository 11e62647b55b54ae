"""The Ganeti OS record in the export/import wire format (``"os"`` of an upsert object).

The shape is a ``POST /device-os`` body without the ``id`` (the enclosing object has it)::

    "os": {"os_type": "debootstrap+default", "mode": "run", "communication": true,
           "parameters": {"dns": {"value": "10.0.0.2", "visibility": "public"},
                          "root_hash": {"value": "…", "visibility": "private"}},
           "install_parameters": {}, "package": {"url": "https://…/os.tgz"},
           "updated_at": "2026-06-01T12:00:00+00:00"}

Public values are exported as stored; private values are decrypted and exported unless
``private=False`` (``imds export --no-private``); secret values and package credentials
are never exported: they live only in the memory of the server that was given them.
"""

from __future__ import annotations

from typing import Any

from imds.errors import ConfigError, InvalidInput, Problem
from imds.models import PRIVATE, PUBLIC, SECRET, OsRecord
from imds.services.ganeti.crypto import PrivateCipher
from imds.services.ganeti.memory import Secret
from imds.services.ganeti.wire import SECTIONS, OsWrite, ParamIn, parse_os_write


def os_to_wire(instance_id: str, record: OsRecord, cipher: PrivateCipher, *, private: bool) -> dict[str, Any]:
    """The record as an export object; ConfigError when a private value cannot be decrypted."""
    body: dict[str, Any] = {"os_type": record.os_type, "mode": record.mode, "communication": record.communication}
    for section in SECTIONS:
        params: dict[str, Any] = {}
        for name, param in getattr(record, section).items():
            if param.visibility == SECRET or param.value is None:
                continue
            if param.visibility == PRIVATE:
                if not private:
                    continue
                clear = cipher.open(param.value, encrypted=param.encrypted)
                if clear is None:
                    msg = (f"instance {instance_id}: private parameter {section}.{name} cannot be decrypted: "
                           "give the --private-key-file it was stored with, or export with --no-private")
                    raise ConfigError(msg)
                params[name] = {"value": clear, "visibility": PRIVATE}
            else:
                params[name] = {"value": param.value, "visibility": PUBLIC}
        body[section] = params
    if record.package_url is not None:
        body["package"] = {"url": record.package_url}
    if record.updated_at is not None:
        body["updated_at"] = record.updated_at.isoformat()
    return body


def parse_os_item(raw: Any, instance_id: str, *, max_value_bytes: int) -> OsWrite:
    """The ``"os"`` member of an upsert object → OsWrite (InvalidInput with fields under ``os.``)."""
    if not isinstance(raw, dict):
        raise InvalidInput.one("os", "must be an object (a POST /device-os body without id)")
    try:
        return parse_os_write({**raw, "id": instance_id}, max_value_bytes=max_value_bytes)
    except InvalidInput as exc:
        raise InvalidInput([Problem(f"os.{p.field}", p.message) for p in exc.problems]) from exc


def os_unchanged(write: OsWrite, stored: OsRecord | None, cipher: PrivateCipher) -> bool:  # noqa: PLR0911 - one early exit per difference
    """Whether storing ``write`` would change nothing (a write with secrets always changes something)."""
    if stored is None or write.package_auth is not None:
        return False
    if (write.os_type, write.mode, write.communication, write.package_url) != (
        stored.os_type, stored.mode, stored.communication, stored.package_url):
        return False
    if write.updated_at is not None and write.updated_at != stored.updated_at:
        return False
    for section in SECTIONS:
        wanted: dict[str, ParamIn] = getattr(write, section)
        if set(wanted) != set(getattr(stored, section)):
            return False
        for name, param in wanted.items():
            have = getattr(stored, section)[name]
            if param.visibility == SECRET or have.visibility != param.visibility:
                return False
            value = param.value.reveal() if isinstance(param.value, Secret) else param.value
            clear = have.value if have.visibility == PUBLIC else cipher.open(have.value or "",
                                                                             encrypted=have.encrypted)
            if clear != value:
                return False
    return True


def os_write_to_wire(write: OsWrite) -> dict[str, Any]:
    """A parsed write back as its ``"os"`` object (values revealed: it goes to a server)."""
    body: dict[str, Any] = {"os_type": write.os_type, "mode": write.mode, "communication": write.communication}
    for section in SECTIONS:
        params: dict[str, ParamIn] = getattr(write, section)
        body[section] = {
            name: {"value": p.value.reveal() if isinstance(p.value, Secret) else p.value, "visibility": p.visibility}
            for name, p in params.items()
        }
    if write.package_url is not None:
        package: dict[str, Any] = {"url": write.package_url}
        if write.package_auth is not None:
            package["username"] = write.package_auth.username.reveal()
            package["password"] = write.package_auth.password.reveal()
        body["package"] = package
    if write.updated_at is not None:
        body["updated_at"] = write.updated_at.isoformat()
    return body
