r"""Device role tags: the ``devices`` part of a metadata document, checked before anything is written.

Three rules, each reported with the offending device's path (``metadata.devices[3]``):

1. The JSON schema shipped in ``imds/services/schemas/device-role-tagging.schema.json``
   (Draft 2020-12; a copy of the design's fixture, append-only). A schema error names the
   deepest field (``metadata.devices[3].mac``) and the schema keyword that failed. When a
   device matches none of the ``oneOf`` branches, the branch its ``type`` (or ``bus``)
   selects is the one reported on, not a list of every alternative.
2. A tag names one logical device per device type: two NICs may not share a tag, a NIC and
   a disk may. Two entries of the same type may share a tag only when they are the same
   backend exposed twice — disks with the same ``serial`` (a Xen guest sees one volume on
   both its IDE and its PV bus).
3. No string in a device holds a control character. The schema's patterns are anchored with
   ``^…$``, and a JSON Schema validator in Python searches with ``re``, whose ``$`` also
   matches before a trailing newline: ``"mac": "fa:16:3e:00:00:01\n"`` passes the schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from imds.errors import Problem

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError

SCHEMA_FILE = "device-role-tagging.schema.json"
FIELD = "metadata.devices"
_REQUIRED = re.compile(r"'([^']+)' is a required property")  # fullmatch
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Entries of one type that are the same backend exposed twice carry the same value here.
_SAME_BACKEND = {"disk": "serial"}


@cache
def schema() -> dict[str, Any]:
    """The device role tagging schema shipped with imds."""
    text = resources.files("imds.services").joinpath("schemas", SCHEMA_FILE).read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@cache
def _validator() -> Draft202012Validator:
    # jsonschema loads on the first check, not with the CLI (imds --help stays quick).
    from jsonschema import Draft202012Validator  # noqa: PLC0415

    Draft202012Validator.check_schema(schema())
    return Draft202012Validator(schema())


def check_devices(devices: Any) -> list[Problem]:
    """Every problem with a ``devices`` value, schema errors first; empty when it is valid."""
    problems = [_problem(error) for error in _leaves(_validator().iter_errors({"devices": devices}))]
    if isinstance(devices, list):
        problems += _shared_tags(devices)
        problems += _control_characters(devices)
    return list(dict.fromkeys(problems))  # one branch per bus can repeat the same complaint


def _leaves(errors: Iterable[ValidationError]) -> Iterator[ValidationError]:
    """Replace each failed ``oneOf`` by the errors of the branch the instance was meant for."""
    for error in errors:
        if error.validator not in ("oneOf", "anyOf") or not error.context:
            yield error
            continue
        branches: dict[Any, list[ValidationError]] = {}
        for sub in error.context:
            branches.setdefault(sub.relative_schema_path[0], []).append(sub)
        # A branch whose discriminator (a "const": type or bus) failed was not meant for it.
        meant = [subs for subs in branches.values() if not any(s.validator == "const" for s in subs)]
        if len(meant) == 1 or (meant and _same_complaints(meant)):
            yield from _leaves(meant[0])
        elif not meant:
            yield _discriminator_error([s for subs in branches.values() for s in subs])
        else:
            yield error


def _same_complaints(branches: list[list[ValidationError]]) -> bool:
    seen = {frozenset((tuple(e.absolute_path), e.message) for e in subs) for subs in branches}
    return len(seen) == 1


def _discriminator_error(subs: list[ValidationError]) -> ValidationError:
    """No branch's discriminator matched: say which values are allowed."""
    from jsonschema.exceptions import ValidationError  # noqa: PLC0415 - loaded with the validator anyway

    consts = [s for s in subs if s.validator == "const"]
    allowed = ", ".join(json.dumps(s.validator_value) for s in consts)
    where = consts[0]
    value = where.instance
    return ValidationError(
        f"{json.dumps(value)} is not one of {allowed}",
        validator="const",
        path=where.absolute_path,
        instance=value,
    )


def _problem(error: ValidationError) -> Problem:
    path = list(error.absolute_path)
    message = error.message
    if error.validator == "required":
        # Name the missing field itself: metadata.devices[3].mac "is required".
        # One error per missing property; its name is only in the message ("'mac' is a required property").
        missing = _REQUIRED.fullmatch(message)
        if missing is not None:
            path.append(missing.group(1))
            message = "is required"
    return Problem(_field(path), f"{message} (schema: {error.validator})")


def _field(path: list[Any]) -> str:
    """``['devices', 3, 'mac']`` → ``metadata.devices[3].mac``."""
    text = "metadata"
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def _control_characters(devices: list[Any]) -> list[Problem]:
    """Each string (value or key) in a device that holds a C0/C1 control character or DEL."""
    problems = []
    stack: list[tuple[Any, str]] = [(device, f"{FIELD}[{index}]") for index, device in enumerate(devices)]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            for key, child in value.items():
                bad = _CONTROL.search(key) is not None
                shown = f"{path}.{key!r}" if bad else f"{path}.{key}"
                if bad:
                    problems.append(Problem(shown, "key holds a control character"))
                stack.append((child, shown))
        elif isinstance(value, list):
            stack.extend((child, f"{path}[{index}]") for index, child in enumerate(value))
        elif isinstance(value, str) and _CONTROL.search(value):
            problems.append(Problem(path, "holds a control character (a newline, tab, ...)"))
    return sorted(problems, key=lambda problem: problem.field)


def _shared_tags(devices: list[Any]) -> list[Problem]:
    problems = []
    first: dict[tuple[str, str], int] = {}
    for index, device in enumerate(devices):
        if not isinstance(device, dict) or not isinstance(device.get("type"), str):
            continue
        kind = device["type"]
        tags = device.get("tags")
        for tag in dict.fromkeys(tags if isinstance(tags, list) else []):
            if not isinstance(tag, str):
                continue
            holder = first.setdefault((kind, tag), index)
            if holder != index and not _same_backend(kind, devices[holder], device):
                problems.append(Problem(
                    f"{FIELD}[{index}]",
                    f"tag {tag!r} already names {kind} {FIELD}[{holder}]: a tag names one logical device per "
                    f"device type (entries of one type may share a tag only when they are the same backend, "
                    f"e.g. disks with the same serial)",
                ))
    return problems


def _same_backend(kind: str, one: dict[str, Any], other: dict[str, Any]) -> bool:
    key = _SAME_BACKEND.get(kind)
    return key is not None and isinstance(one.get(key), str) and bool(one[key]) and one.get(key) == other.get(key)
