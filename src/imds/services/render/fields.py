"""Reading a free-form metadata document: a field as the shape a renderer needs, or empty.

The document is whatever the admin pushed; a renderer skips what it cannot use rather than
fail (``imds.services.records.shape`` refuses only the fields renderers compute with).
"""

from __future__ import annotations

from typing import Any

from imds.models import JsonObject


def as_object(value: Any) -> JsonObject:
    """``value`` when it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """``value`` when it is a JSON array, else an empty list."""
    return value if isinstance(value, list) else []
