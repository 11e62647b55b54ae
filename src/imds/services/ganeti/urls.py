"""URLs in OS records (``package.url``, an ``os-image`` URL): whether one parses, before anything is fetched."""

from __future__ import annotations

from urllib.parse import urlsplit

URL_SCHEMES = ("http://", "https://")
IMAGE_PARAMETER = "os-image"


def url_problem(value: str) -> str | None:
    """Why ``value``, an http(s) URL by its scheme, cannot be fetched, or None (also None for anything else)."""
    if not value.lower().startswith(URL_SCHEMES):
        return None
    try:
        parts = urlsplit(value)
        _ = parts.port  # a port that is not a number raises here
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if not parts.hostname:
        return "is not a valid URL (no host)"
    if any(ord(character) < 0x21 or character == "\x7f" for character in value):  # ASCII controls and space
        return "is not a valid URL (a space or control character)"
    return None
