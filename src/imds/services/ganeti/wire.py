"""``POST /device-os`` bodies → ``OsWrite``. A problem names its field, never a value.

Private and secret values are wrapped in ``Secret`` as soon as they are read, so no
repr, log line or error message built from the parsed write can show them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from imds.errors import InvalidInput, Problem
from imds.models import OS_MODES, PUBLIC, VISIBILITIES
from imds.services.ganeti.memory import PackageAuth, Secret
from imds.services.ganeti.urls import IMAGE_PARAMETER, URL_SCHEMES, url_problem
from imds.services.records.limits import NOT_TEXT, valid_text
from imds.services.records.wire import document_timestamp, parse_instance_id

# fullmatch, never match + "$": "$" also matches before a trailing newline (a name "x\n" would reach
# os/environment as a line of its own, which sh runs as a command).
NAME = re.compile(r"[a-z0-9_-]{1,64}")
OS_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
PACKAGE_SUFFIXES = (".tar.gz", ".tgz")
SECTIONS = ("parameters", "install_parameters")
_FIELDS = frozenset({"id", "os_type", "mode", "communication", *SECTIONS, "package", "updated_at"})
_SHOWN = 40  # characters of an offending name shown back (names are not secret; keep errors short)


@dataclass(frozen=True)
class ParamIn:
    """One incoming parameter: public values as they are, private and secret ones wrapped."""

    visibility: str
    value: str | Secret

    def __repr__(self) -> str:
        shown = self.value if self.visibility == PUBLIC else "<hidden>"
        return f"ParamIn({self.visibility}, {shown!r})"


@dataclass(frozen=True)
class OsWrite:
    """A full-replacement write of an instance's OS record."""

    id: str
    os_type: str
    mode: str
    communication: bool
    parameters: dict[str, ParamIn]
    install_parameters: dict[str, ParamIn]
    package_url: str | None
    package_auth: PackageAuth | None
    updated_at: datetime | None


def parse_os_write(body: Any, *, max_value_bytes: int) -> OsWrite:
    """Validate a ``POST /device-os`` body; InvalidInput lists every offending field."""
    problems: list[Problem] = []
    if not isinstance(body, dict):
        raise InvalidInput.one("body", "must be a JSON object")
    problems.extend(Problem(str(u)[:_SHOWN], "is not a field of an OS record") for u in sorted(set(body) - _FIELDS))
    instance_id = None
    try:
        instance_id = parse_instance_id(body.get("id"))
    except InvalidInput as exc:
        problems.extend(exc.problems)
    os_type = body.get("os_type")
    if not isinstance(os_type, str) or not OS_TYPE.fullmatch(os_type):
        problems.append(Problem("os_type", "is required: an OS name such as debootstrap+default"))
    mode = body.get("mode")
    if mode not in OS_MODES:
        problems.append(Problem("mode", f"must be one of {', '.join(OS_MODES)}"))
    communication = body.get("communication", False)
    if not isinstance(communication, bool):
        problems.append(Problem("communication", "must be true or false"))
    sections = {s: _parameters(body.get(s), s, max_value_bytes, problems) for s in SECTIONS}
    url, auth = _package(body.get("package"), problems)
    stamp = None
    if "updated_at" in body:
        stamp = document_timestamp({"updated_at": body["updated_at"]})
        if stamp is None:
            problems.append(Problem("updated_at", "must be an RFC 3339 timestamp string"))
    if problems or instance_id is None:
        raise InvalidInput(problems)
    return OsWrite(
        instance_id, str(os_type), str(mode), bool(communication),
        sections["parameters"], sections["install_parameters"], url, auth, stamp,
    )


def _parameters(raw: Any, section: str, max_bytes: int, problems: list[Problem]) -> dict[str, ParamIn]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(Problem(section, "must be an object of NAME: {value, visibility}"))
        return {}
    found: dict[str, ParamIn] = {}
    for name, entry in raw.items():
        where = f"{section}.{str(name)[:_SHOWN]}"
        if not NAME.fullmatch(name):
            problems.append(Problem(where, "a parameter name is 1-64 characters of a-z, 0-9, _ and -"))
            continue
        if not isinstance(entry, dict) or set(entry) - {"value", "visibility"}:
            problems.append(Problem(where, 'must be {"value": STRING, "visibility": public|private|secret}'))
            continue
        visibility, value = entry.get("visibility", PUBLIC), entry.get("value")
        if visibility not in VISIBILITIES:
            problems.append(Problem(f"{where}.visibility", f"must be one of {', '.join(VISIBILITIES)}"))
            continue
        if (problem := _value_problem(name, value, max_bytes)) is not None:
            problems.append(Problem(f"{where}.value", problem))
            continue
        text = str(value)  # a string: _value_problem said so
        found[name] = ParamIn(visibility, text if visibility == PUBLIC else Secret(text))
    return found


def _value_problem(name: str, value: Any, max_bytes: int) -> str | None:
    """Why a parameter's value is refused (a string of valid text, within the limit; an image a good URL), or None."""
    if not isinstance(value, str):
        return "must be a string"
    if not valid_text(value):
        return NOT_TEXT
    if len(value.encode()) > max_bytes:
        return f"is longer than {max_bytes} bytes (--os-param-max-bytes)"
    if name == IMAGE_PARAMETER:
        return url_problem(value)
    return None


def _package_url(url: Any) -> str | None:
    """Why the package URL is refused, or None."""
    if isinstance(url, str) and not valid_text(url):
        return NOT_TEXT
    if not isinstance(url, str) or not url.lower().startswith(URL_SCHEMES):
        return "must be an http:// or https:// URL"
    if (problem := url_problem(url)) is not None:
        return problem
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials: send package.username/password"
    if not parts.path.endswith(PACKAGE_SUFFIXES):
        return "must name a .tar.gz or .tgz archive"
    return None


def _package(raw: Any, problems: list[Problem]) -> tuple[str | None, PackageAuth | None]:
    if raw is None:
        return None, None
    if not isinstance(raw, dict) or set(raw) - {"url", "username", "password"}:
        problems.append(Problem("package", 'must be {"url", "username"?, "password"?}'))
        return None, None
    url = raw.get("url")
    if (refused := _package_url(url)) is not None:
        problems.append(Problem("package.url", refused))
        return None, None
    username, password = raw.get("username"), raw.get("password")
    if username is None and password is None:
        return str(url), None
    if not (isinstance(username, str) and isinstance(password, str) and valid_text(username + password)):
        problems.append(Problem("package", "username and password go together, both strings (valid Unicode text)"))
        return None, None
    return str(url), PackageAuth(Secret(username), Secret(password))
