"""The admin wire format (hollow's, plus a friendlier form) → write models.

Shared by the admin API and, later, the upstream lookup client, which receives the same
shapes. Every offending field is reported at once, each under its JSON path
(``ipAddresses[3]``, ``metadata.updated_at``); nothing is written when any is wrong.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar

from imds.errors import InvalidInput, Problem
from imds.models import RECORD_HOST, JsonObject, MetadataWrite, Network, UserdataWrite, covered
from imds.services.catalog.addresses import display, parse_network
from imds.services.records.limits import Limits, check_addresses_count, check_document, flag_of, wide_prefix
from imds.services.records.parts import check_parts
from imds.services.records.shape import check_shape
from imds.signing import valid_host

# fullmatch, never match + "$": "$" also matches before a trailing newline.
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)
_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")
ENCODINGS = ("text", "base64")
_HOST_RULE = "must be a host name (letters, digits, '.', '_', '-'; 253 at most) or null"
DEFAULT_LIMITS = Limits()
OFF_LOOP_BYTES = 64 * 1024  # smaller bodies parse in well under a millisecond: a thread would cost more
T = TypeVar("T")


def _no_constant(name: str) -> Any:
    msg = f"{name} is not allowed (JSON has no NaN or Infinity)"
    raise ValueError(msg)


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        msg = f"the number {text[:40]} is out of range"
        raise ValueError(msg)
    return value


def loads_strict(text: str | bytes, field: str = "body") -> Any:
    """Standard JSON only (no NaN/Infinity, finite numbers), or InvalidInput naming ``field``.

    Too-deep nesting and over-long integers are refused here too (Python raises
    RecursionError and ValueError for them, which would otherwise become a 500).
    """
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError as exc:
        message = f"is nested too deeply to parse (limit: {flag_of('max_document_depth')})"
        raise InvalidInput.one(field, message) from exc
    except UnicodeDecodeError as exc:
        raise InvalidInput.one(field, f"not valid JSON: {exc}") from exc
    except ValueError as exc:  # JSONDecodeError, our hooks, and Python's int-digits limit
        shown = str(exc).split("; use sys.set_int_max_str_digits")[0]
        raise InvalidInput.one(field, f"not valid JSON: {shown}") from exc


def parse_json(raw: bytes) -> Any:
    """Decode a request body as JSON, or raise InvalidInput naming ``body``."""
    return loads_strict(raw)


async def parse_body(parse: Callable[[Any, Limits], T], raw: bytes, limits: Limits) -> T:
    """``parse(parse_json(raw), limits)``; a large body is decoded and checked in a worker thread.

    Parsing and checking tens of thousands of addresses takes the CPU for a noticeable
    time; off the event loop, instance reads keep being answered meanwhile (the thread
    gives the GIL back every few milliseconds).
    """

    def work() -> T:
        return parse(parse_json(raw), limits)

    if len(raw) < OFF_LOOP_BYTES:
        return work()
    return await asyncio.to_thread(work)


def parse_instance_id(value: Any, field: str = "id") -> str:
    """A canonical (lower-case, hyphenated) UUID, or InvalidInput naming ``field``."""
    problems: list[Problem] = []
    instance_id = _instance_id(value, field, problems)
    if problems or instance_id is None:
        raise InvalidInput(problems)
    return instance_id


def parse_metadata_write(body: Any, limits: Limits = DEFAULT_LIMITS) -> MetadataWrite:
    """``{id, ipAddresses, metadata, host?}``: metadata is a JSON object or a JSON-encoded string.

    ``host``, when given, is where the instance runs, stored as the document's ``host``
    (``_with_host``).

    The document's own ``id`` may differ from the record id, as in hollow: the document is
    stored and served as sent, and every flavor names the instance by the record id
    (``notes`` says so in the write's answer). With ``limits.strict_records`` it must be the
    record's id (or be left out).
    """
    problems: list[Problem] = []
    fields = _object(body, problems)
    instance_id = _instance_id(fields.get("id"), "id", problems)
    addresses = _addresses(fields, problems, limits)
    document = _metadata(fields.get("metadata"), problems, limits)
    if document is not None and instance_id is not None and "id" in document and limits.strict_records:
        _document_id(document["id"], instance_id, problems)
    if document is not None:
        document = _with_host(fields.get(RECORD_HOST), document, problems)
    if problems or instance_id is None or document is None:
        raise InvalidInput(problems)
    return MetadataWrite(instance_id, addresses, document)


def _with_host(given: Any, document: JsonObject, problems: list[Problem]) -> JsonObject:
    """The document with the record's host: its own ``host``, or the write's top-level ``host``.

    The host (where the instance runs: Nova's ``instance.host``, Ganeti's primary node) is
    kept as the document's ``host``, which serve compares with the host that signs a claim;
    a write may name it beside the document too, as a source of truth has it. Either must be
    a host name (``null``: none), and the two must agree: a value the check could never match,
    or a number that would leave the check off, is refused rather than stored.
    """
    stored = document.get(RECORD_HOST)
    if stored is not None and not (isinstance(stored, str) and valid_host(stored)):
        problems.append(Problem(f"metadata.{RECORD_HOST}", _HOST_RULE))
    if given is None:
        return document
    if not (isinstance(given, str) and valid_host(given)):
        problems.append(Problem(RECORD_HOST, _HOST_RULE))
        return document
    if stored is not None and stored != given:
        problems.append(Problem(RECORD_HOST, f"is {given!r} but metadata.{RECORD_HOST} is {str(stored)[:80]!r}"))
        return document
    return {**document, RECORD_HOST: given}


class NoteKind(StrEnum):
    """What a note is about, named by the field it reads (``imds import`` counts the notes of one kind together)."""

    ADDRESSES = "ipAddresses"  # an address with host bits set, a prefix wider than WIDEST_PREFIX
    METADATA = "metadata"  # a document id other than the record id
    OS = "os"  # a secret OS value an offline import drops
    MOVED = "moved"  # an address a write took from another instance (``moved_notes``)


@dataclass(frozen=True)
class Note:
    """One thing a write's answer says besides its outcome: its kind, and the line that says it."""

    kind: NoteKind
    text: str

    def __str__(self) -> str:
        return self.text


def notes(write: MetadataWrite | UserdataWrite) -> list[Note]:
    """What a write's answer says about hollow's readings it relied on, and wide prefixes it holds (nothing is silent).

    An address with host bits set covers the network it names; a document id other than the
    record id is stored as sent while every flavor names the instance by the record id; a
    prefix wider than ``WIDEST_PREFIX`` (taken only with ``--allow-wide-prefixes``) answers
    every caller no longer prefix claims.
    """
    found = [Note(NoteKind.ADDRESSES, f"ipAddresses: {network} has host bits set: it covers the network {covers} "
                                      "(matched by containment, longest prefix; stored and shown as sent)")
             for network in write.addresses if (covers := covered(network)) is not None]
    found += [Note(NoteKind.ADDRESSES, f"ipAddresses: {why}")
              for network in write.addresses if (why := wide_prefix(network)) is not None]
    if isinstance(write, MetadataWrite) and "id" in write.metadata:
        document_id = write.metadata["id"]
        if not isinstance(document_id, str) or document_id.lower() != write.id:
            found.append(Note(NoteKind.METADATA,
                              f"metadata.id: {str(document_id)[:80]!r} is not the record id: the document is stored "
                              f"and served as sent; every flavor names the instance {write.id}"))
    return found


def moved_notes(moved: Mapping[Network, str]) -> list[str]:
    """A warning per address a write took from another instance (one holder per address: the last write wins)."""
    return [f"ipAddresses: {display(network)} moved here from instance {holder} (an address has one holder: "
            "the last write wins)" for network, holder in moved.items()]


def _document_id(value: Any, instance_id: str, problems: list[Problem]) -> None:
    if not isinstance(value, str) or value.lower() != instance_id:
        problems.append(Problem("metadata.id", f"must be the record id {instance_id} (or be left out)"))


def parse_userdata_write(
    body: Any, limits: Limits = DEFAULT_LIMITS, *, addresses: tuple[Network, ...] | None = None,
) -> UserdataWrite:
    """``{id, ipAddresses, userdata, userdata_encoding?}``.

    Without ``userdata_encoding``, a value made only of the base64 alphabet with valid
    padding is decoded (hollow's wire format sends bytes as base64); anything else is
    stored verbatim as UTF-8 text. ``"text"`` or ``"base64"`` overrides the guess.
    ``addresses``: this body's ``ipAddresses`` as ``parse_metadata_write`` read them with
    the same ``limits`` (an import item's two parts share one list): not parsed again.
    """
    problems: list[Problem] = []
    fields = _object(body, problems)
    instance_id = _instance_id(fields.get("id"), "id", problems)
    if addresses is None:
        addresses = _addresses(fields, problems, limits)
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
    elif not isinstance(value, str) or not _UUID.fullmatch(value):
        problems.append(Problem(field, "must be a UUID such as 3f2504e0-4f89-11d3-9a0c-0305e82c3301"))
    else:
        return value.lower()
    return None


def _addresses(fields: dict[str, Any], problems: list[Problem], limits: Limits) -> tuple[Network, ...]:
    if "ipAddresses" not in fields or fields["ipAddresses"] is None:
        if limits.strict_records or not fields:  # a body that is not an object has none of its fields
            problems.append(Problem("ipAddresses", "is required: the complete list (send [] to remove every address)"))
        return ()  # hollow's reading: no list is the empty list (the answer's "dropped" names what went)
    values = fields["ipAddresses"]
    if not isinstance(values, list):
        problems.append(Problem("ipAddresses", "must be a list of IP addresses or CIDRs"))
        return ()
    too_many = check_addresses_count(len(values), limits)
    if too_many is not None:
        problems.append(too_many)
        return ()
    networks: dict[Network, None] = {}
    for index, value in enumerate(values):
        if not isinstance(value, str):
            problems.append(Problem(f"ipAddresses[{index}]", "must be a string"))
            continue
        try:
            network = parse_network(value, spelled=not limits.strict_records)
        except ValueError as exc:
            problems.append(Problem(f"ipAddresses[{index}]", str(exc)))
            continue
        if not limits.allow_wide_prefixes and (why := wide_prefix(network)) is not None:
            problems.append(Problem(f"ipAddresses[{index}]", why))
            continue
        networks[network] = None
    return tuple(networks)


def _metadata(value: Any, problems: list[Problem], limits: Limits) -> JsonObject | None:
    if value is None:
        problems.append(Problem("metadata", "is required"))
        return None
    if isinstance(value, str):
        try:
            value = loads_strict(value, "metadata")
        except InvalidInput as exc:
            problems.extend(Problem(p.field, f"is a string but {p.message}") for p in exc.problems)
            return None
    if not isinstance(value, dict):
        problems.append(Problem("metadata", "must be a JSON object (or a JSON-encoded object string)"))
        return None
    found = check_document(value, "metadata", limits)  # strings, numbers, depth and size first:
    if found:  # the checks below assume a document that passed them
        problems.extend(found)
        return None
    if "updated_at" in value and document_timestamp(value) is None:
        problems.append(Problem("metadata.updated_at", "must be an RFC 3339 timestamp string"))
    problems.extend(check_shape(value))  # the Equinix fields renderers compute with (network.addresses)
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
        return _utf8(value, problems)
    if encoding == "invalid":
        return None
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:  # binascii.Error, and ValueError for characters outside ASCII
        problems.append(Problem("userdata", 'is not valid base64 (userdata_encoding is "base64")'))
        return None


def _utf8(value: str, problems: list[Problem]) -> bytes | None:
    try:
        return value.encode()
    except UnicodeEncodeError:
        problems.append(Problem("userdata", "is not valid Unicode text (it holds a lone surrogate such as \\ud800)"))
        return None


def _looks_base64(value: str) -> bool:
    return bool(value) and _BASE64.fullmatch(value) is not None
