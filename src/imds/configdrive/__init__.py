"""Config drive images: ISO 9660 (Joliet + Rock Ridge) written from a ``{path: bytes}`` mapping.

What a drive holds is ``imds.services.render.drive``; ``imds.services.drives`` builds the
image from a stored instance. This package only writes and reads ISOs (pycdlib).
"""

from __future__ import annotations

from imds.configdrive.iso import iso_bytes, list_iso

__all__ = ["MEDIA_TYPE", "iso_bytes", "list_iso"]

MEDIA_TYPE = "application/x-iso9660-image"
