"""Config drives: the rendered documents written to an ISO 9660 image, for guests without a network path.

``layout`` decides what the drive holds (from the same renderers the HTTP flavors serve),
``iso`` writes it. ``image(instance, fmt)`` does both.
"""

from __future__ import annotations

from imds.configdrive.iso import iso_bytes
from imds.configdrive.layout import CONFIG_2, FORMATS, LABELS, NOCLOUD, Format, layout
from imds.models import Instance

__all__ = ["CONFIG_2", "FORMATS", "LABELS", "NOCLOUD", "Format", "image", "layout"]

MEDIA_TYPE = "application/x-iso9660-image"


def image(instance: Instance, fmt: Format = CONFIG_2) -> bytes:
    """The ISO image of a drive of format ``fmt`` (``config-2`` or ``nocloud``) for ``instance``."""
    return iso_bytes(layout(instance, fmt), LABELS[fmt])
