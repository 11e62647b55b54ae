"""Template fields (``api_url``, ``phone_home_url``, ``user_state_url``) in hollow's syntax: compiling and rendering.

A leaf: it imports only the leaves ``imds.errors`` and ``imds.models``, so the leaf
``imds.config`` may compile each configured field at load (a bad one is refused naming its
flag); ``imds.services.render.templates`` applies them to documents.

hollow uses Go's text/template over the metadata document; operators write fields such
as ``https://{{.facility}}.example/{{.id}}``. imds supports that subset: ``{{.key}}`` and
nested ``{{.a.b}}`` references. Anything else inside ``{{ }}`` is refused at startup. A
reference to a missing key renders as an empty string (Go would print ``<no value>``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from imds.errors import ConfigError
from imds.models import JsonObject

_ACTION = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_REFERENCE = re.compile(r"\s*\.([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\s*")  # fullmatch


@dataclass(frozen=True)
class Template:
    """One compiled template: literal text and key paths, alternating."""

    key: str
    parts: tuple[str | tuple[str, ...], ...]

    def render(self, document: JsonObject) -> str:
        """Fill the template from ``document``."""
        return "".join(part if isinstance(part, str) else _text(_dig(document, part)) for part in self.parts)


def compile_template(key: str, source: str) -> Template:
    """Compile ``source``; raise ConfigError naming ``key`` for unsupported syntax."""
    parts: list[str | tuple[str, ...]] = []
    position = 0
    for match in _ACTION.finditer(source):
        reference = _REFERENCE.fullmatch(match.group(1))
        if reference is None:
            msg = f"template for {key}: only {{{{.field}}}} references are supported, got {match.group(0)!r}"
            raise ConfigError(msg)
        parts.extend([source[position : match.start()], tuple(reference.group(1).split("."))])
        position = match.end()
    parts.append(source[position:])
    if "{{" in source[position:] or any("}}" in p or "{{" in p for p in parts if isinstance(p, str)):
        msg = f"template for {key}: unbalanced {{{{ }}}} in {source!r}"
        raise ConfigError(msg)
    return Template(key, tuple(p for p in parts if p != ""))


def _dig(document: Any, path: tuple[str, ...]) -> Any:
    value = document
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, separators=(",", ":"))
