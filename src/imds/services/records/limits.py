"""Write-time limits and the checks every stored JSON document must pass.

A document is stored only if every renderer can serve it: its strings are valid Unicode
(no lone surrogates, which UTF-8 cannot carry), its numbers are finite, and it stays
within the configured depth and key count. The checks walk the document once, without
recursion, and report each offending value under its path (``metadata.a.b[2]``).

| limit | flag | default |
|---|---|---|
| addresses per write | ``--max-addresses`` | 4096 |
| nesting depth of a document | ``--max-document-depth`` | 64 |
| object keys in a document | ``--max-document-keys`` | 20000 |
| request body bytes | ``--max-body-bytes`` | 1 MiB (checked while reading, see ``imds.web.body``) |
| one item's userdata or metadata | ``--max-body-bytes`` | 1 MiB (``imds import``: as one admin write) |
| hollow's readings or the strict ones | ``--strict-records`` | off (see docs/hollow.md) |

The admin API, ``imds import`` and the pull-mode lookups all check with these ``Limits``
(``Limits.of(settings.limits)``), so an import accepts exactly what a write would.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from imds.config import OPTIONS
from imds.errors import Problem
from imds.models import Network

NOT_TEXT = "is not valid Unicode text (it holds a lone surrogate such as \\ud800)"
MAX_PROBLEMS = 20  # a hostile document could have a million bad strings: name the first few
_CONTAINERS = (dict, list)


def flag_of(name: str) -> str:
    """``--flag / IMDS_ENV`` of the option ``name``, for messages that name a limit."""
    option = next(o for o in OPTIONS if o.name == name)
    return f"{option.flag} / {option.env}"


@dataclass(frozen=True)
class Limits:
    """What one admin write may hold."""

    max_addresses: int = 4096
    max_document_depth: int = 64
    max_document_keys: int = 20000
    max_body_bytes: int = 1024 * 1024
    strict_records: bool = False  # True: host bits, a document id not the record's, no ipAddresses → refused
    allow_wide_prefixes: bool = False  # True: a prefix shorter than WIDEST_PREFIX is taken, with a warning

    @classmethod
    def of(cls, settings: Any) -> Limits:
        """The limits in a ``settings.limits`` group (fields absent there keep their defaults)."""
        names = ("max_addresses", "max_document_depth", "max_document_keys", "max_body_bytes", "strict_records",
                 "allow_wide_prefixes")
        return cls(**{name: getattr(settings, name) for name in names if hasattr(settings, name)})


def check_size(field: str, size: int, limits: Limits) -> Problem | None:
    """A problem when one item's ``field`` (userdata, metadata) is larger than one admin write may be."""
    if size <= limits.max_body_bytes:
        return None
    return Problem(field, f"is {size} bytes; at most {limits.max_body_bytes} are accepted, as in one admin write "
                          f"({flag_of('max_body_bytes')})")


def max_item_bytes(limits: Limits) -> int:
    """The most one import item may take as text (the row cap): 16 x ``max_body_bytes``.

    An item's userdata and its metadata may each be ``max_body_bytes``; written as JSON,
    base64 adds a third and escapes up to six times. Anything longer is refused unread.
    """
    return 16 * limits.max_body_bytes


# The shortest prefix an instance address may have by default, per IP version: a wider one
# (0.0.0.0/0 and ::/0 above all) holds addresses far beyond any network one instance is
# given, so its instance answers every caller that no longer prefix claims.
WIDEST_PREFIX = {4: 8, 6: 16}


def wide_prefix(network: Network) -> str | None:
    """Why ``network`` is too wide for one instance, or None."""
    widest = WIDEST_PREFIX[network.version]
    if network.prefixlen >= widest:
        return None
    every = " (every address)" if network.prefixlen == 0 else ""
    return (f"{network} is a /{network.prefixlen}{every}: its instance would answer every caller no longer prefix "
            f"claims; an instance address is at least a /{widest} for IPv{network.version} "
            f"(accepted, with a warning, with {flag_of('allow_wide_prefixes')})")


def check_addresses_count(count: int, limits: Limits) -> Problem | None:
    """A problem when a write lists more addresses than allowed."""
    if count <= limits.max_addresses:
        return None
    return Problem(
        "ipAddresses",
        f"lists {count} addresses; at most {limits.max_addresses} are accepted ({flag_of('max_addresses')})",
    )


def check_document(document: Any, where: str, limits: Limits) -> list[Problem]:
    """Every problem with a JSON value: bad strings, non-finite numbers, depth and key count.

    A document whose strings and numbers are all fine (the encoder says so, at C speed) is
    walked for its depth and key count only; one that is not, value by value, to name each.
    """
    if _text_and_numbers_fine(document) and _within_shape(document, limits):
        return []
    problems: list[Problem] = []
    keys = 0
    stack: list[tuple[Any, str, int]] = [(document, where, 1)]
    while stack and len(problems) < MAX_PROBLEMS:
        value, path, depth = stack.pop()
        if isinstance(value, dict | list) and depth > limits.max_document_depth:
            problems.append(Problem(path, f"is nested deeper than {limits.max_document_depth} levels "
                                          f"({flag_of('max_document_depth')})"))
            continue
        if isinstance(value, dict):
            keys += len(value)
            for key, child in value.items():
                child_path = f"{path}.{key}" if valid_text(key) else f"{path}.{key!r}"
                if not valid_text(key):
                    problems.append(Problem(child_path, "key is not valid Unicode text (a lone surrogate)"))
                stack.append((child, child_path, depth + 1))
        elif isinstance(value, list):
            stack.extend((child, f"{path}[{index}]", depth + 1) for index, child in enumerate(value))
        else:
            problem = _scalar(value, path)
            if problem is not None:
                problems.append(problem)
    if keys > limits.max_document_keys:
        problems.append(Problem(where, f"has {keys} keys; at most {limits.max_document_keys} are accepted "
                                       f"({flag_of('max_document_keys')})"))
    return problems


def _text_and_numbers_fine(document: Any) -> bool:
    """Whether every string is valid Unicode text and every number finite (one encoding pass)."""
    try:
        json.dumps(document, ensure_ascii=False, allow_nan=False, check_circular=False).encode()
    except (ValueError, TypeError, RecursionError):  # UnicodeEncodeError is a ValueError
        return False
    return True


def _within_shape(document: Any, limits: Limits) -> bool:
    """Whether the document is within the depth and key limits (its containers walked a level at a time)."""
    keys, depth, level = 0, 1, [document] if isinstance(document, dict | list) else []
    while level:
        if depth > limits.max_document_depth:
            return False
        below: list[Any] = []
        for value in level:
            if isinstance(value, dict):
                keys += len(value)
                below += [child for child in value.values() if isinstance(child, _CONTAINERS)]
            else:
                below += [child for child in value if isinstance(child, _CONTAINERS)]
        level, depth = below, depth + 1
    return keys <= limits.max_document_keys


def _scalar(value: Any, path: str) -> Problem | None:
    if isinstance(value, str) and not valid_text(value):
        return Problem(path, NOT_TEXT)
    if isinstance(value, float) and not math.isfinite(value):
        return Problem(path, "must be a finite number (JSON has no NaN or Infinity)")
    return None


def valid_text(text: str) -> bool:
    r"""Whether ``text`` can be encoded as UTF-8 (JSON's ``"\udc80"`` decodes to a lone surrogate, which cannot)."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
