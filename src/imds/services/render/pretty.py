"""``json.dumps(value, indent=2)``, byte for byte, from the C encoder.

With an ``indent`` the standard library encodes in pure Python, and each call makes a
reference cycle (its nested encoder closures) that only the cyclic GC frees: in a boot
storm, an identity document per new instance. Without one it uses the C encoder, whose
separators can carry the indentation: a container of scalars is one C call with a comma,
a line break and the indent between items, and only nested containers recurse here.
Keys, strings (``ensure_ascii``), numbers and ``null`` are encoded by the same C code
either way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache

_NESTED = (dict, list, tuple)
_INDENT = "  "


def pretty(value: object) -> str:
    """What ``json.dumps(value, indent=2)`` returns."""
    return _pretty(value, "\n")


def _pretty(value: object, newline: str) -> str:
    """``value`` encoded at the depth whose lines start with ``newline`` (a line break and the indent)."""
    if not isinstance(value, _NESTED) or not value:
        return _flat("\n")(value)  # a scalar, ``{}`` or ``[]``
    inner = newline + _INDENT
    encode = _flat(inner)
    children = value.values() if isinstance(value, dict) else value
    if not any(isinstance(child, _NESTED) for child in children):
        text = encode(value)  # one C call: the brackets hug the items, which the indent separates
    elif isinstance(value, dict):
        text = "{" + ("," + inner).join(f"{_key(encode, name)}: {_pretty(child, inner)}"
                                        for name, child in value.items()) + "}"
    else:
        text = "[" + ("," + inner).join(_pretty(child, inner) for child in value) + "]"
    return text[0] + inner + text[1:-1] + newline + text[-1]


def _key(encode: Callable[[object], str], name: object) -> str:
    """A dict key as the encoder writes it (a number, ``true`` or ``null`` key becomes a string)."""
    return encode({name: None})[1:-len(": null}")]


@cache
def _flat(inner: str) -> Callable[[object], str]:
    """The C encoder whose items are separated by a comma, a line break and ``inner``'s indent."""
    return json.JSONEncoder(separators=("," + inner, ": ")).encode
