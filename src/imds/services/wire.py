"""The admin wire format (hollow's, plus a friendlier form) → write models.

Shared by the admin API and, later, the upstream lookup client, which receives the same
shapes. Every offending field is reported at once, each under its JSON path
(``ipAddresses[3]``, ``metadata.updated_at``); nothing is written when any is wrong.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from datetime import UTC, datetime
from typing import Any

from imds.errors import InvalidInput, Problem
from imds.models import JsonObject, MetadataWrite, Network, UserdataWrite
from imds.services.addresses import parse_network
from imds.services.parts import check_parts

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.IGNORECASE)
_BASE64 = re.compile(r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$")
ENCODINGS = ("text", "base64")


def parse_json(raw: bytes) -> Any:
    """Decode a request body as JSON, or raise InvalidInput naming ``body``."""
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput.one("body", f"not valid JSON: {exc}") from exc


def parse_instance_id(value: Any, field: str = "id") -> str:
    """A canonical (lower-case, hyphenated) UUID, or InvalidInput naming ``field``."""
    problems: list[Problem] = []
    instance_id = _instance_id(value, field, problems)
    if problems or instance_id is None:
        raise InvalidInput(problems)
    return instance_id


def parse_metadata_write(body: Any) -> MetadataWrite:
    """``{id, ipAddresses, metadata}``: metadata is a JSON object or a JSON-encoded string."""
    problems: list[Problem] = []
    fields = _object(body, problems)
    instance_id = _instance_id(fields.get("id"), "id", problems)
    addresses = _addresses(fields, problems)
    document = _metadata(fields.get("metadata"), problems)
    if problems or instance_id is None or document is None:
        raise InvalidInput(problems)
    return MetadataWrite(instance_id, addresses, document)


def parse_userdata_write(body: Any) -> UserdataWrite:
    """``{id, ipAddresses, userdata, userdata_encoding?}``.

    Without ``userdata_encoding``, a value made only of the base64 alphabet with valid
    padding is decoded (hollow's wire format sends bytes as base64); anything else is
    stored verbatim as UTF-8 text. ``"text"`` or ``"base64"`` overrides the guess.
    """
    problems: list[Problem] = []
    fields = _object(body, problems)
    instance_id = _instance_id(fields.get("id"), "id", problems)
    addresses = _addresses(fields, problems)
    userdata = _userdata(fields, problems)
    if problems or instance_id is None or userdata is None:
        raise InvalidInput(problems)
    return UserdataWrite(instance_id, addresses, userdata)


def document_timestamp(document: JsonObject) -> datetime | None:
    """The document's top-level ``updated_at`` as an aware datetime, if it has a valid one."""
    value = document.get("updated_at")
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _object(body: Any, problems: list[Problem]) -> dict[str, Any]:
    if isinstance(body, dict):
        return body
    problems.append(Problem("body", "must be a JSON object"))
    return {}


def _instance_id(value: Any, field: str, problems: list[Problem]) -> str | None:
    if value is None:
        problems.append(Problem(field, "is required"))
    elif not isinstance(value, str) or not _UUID.match(value):
        problems.append(Problem(field, "must be a UUID such as 3f2504e0-4f89-11d3-9a0c-0305e82c3301"))
    else:
        return value.lower()
    return None


def _addresses(fields: dict[str, Any], problems: list[Problem]) -> tuple[Network, ...]:
    if "ipAddresses" not in fields or fields["ipAddresses"] is None:
        problems.append(Problem("ipAddresses", "is required: the complete list (send [] to remove every address)"))
        return ()
    values = fields["ipAddresses"]
    if not isinstance(values, list):
        problems.append(Problem("ipAddresses", "must be a list of IP addresses or CIDRs"))
        return ()
    networks: dict[Network, None] = {}
    for index, value in enumerate(values):
        if not isinstance(value, str):
            problems.append(Problem(f"ipAddresses[{index}]", "must be a string"))
            continue
        try:
            networks[parse_network(value)] = None
        except ValueError as exc:
            problems.append(Problem(f"ipAddresses[{index}]", str(exc)))
    return tuple(networks)


def _metadata(value: Any, problems: list[Problem]) -> JsonObject | None:
    if value is None:
        problems.append(Problem("metadata", "is required"))
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            problems.append(Problem("metadata", f"is a string but not valid JSON: {exc}"))
            return None
    if not isinstance(value, dict):
        problems.append(Problem("metadata", "must be a JSON object (or a JSON-encoded object string)"))
        return None
    if "updated_at" in value and document_timestamp(value) is None:
        problems.append(Problem("metadata.updated_at", "must be an RFC 3339 timestamp string"))
    problems.extend(check_parts(value))  # devices, network_data, vendor_data (OpenStack parts)
    return value


def _userdata(fields: dict[str, Any], problems: list[Problem]) -> bytes | None:
    encoding = fields.get("userdata_encoding")
    if encoding is not None and encoding not in ENCODINGS:
        problems.append(Problem("userdata_encoding", 'must be "text" or "base64"'))
        encoding = "invalid"
    value = fields.get("userdata")
    if value is None:
        problems.append(Problem("userdata", 'is required (send "" for empty userdata)'))
        return None
    if not isinstance(value, str):
        problems.append(Problem("userdata", "must be a string"))
        return None
    if encoding == "text" or (encoding is None and not _looks_base64(value)):
        return value.encode()
    if encoding == "invalid":
        return None
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        problems.append(Problem("userdata", 'is not valid base64 (userdata_encoding is "base64")'))
        return None


def _looks_base64(value: str) -> bool:
    return bool(value) and _BASE64.match(value) is not None
