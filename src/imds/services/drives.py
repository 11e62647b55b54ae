"""Config drive images of stored instances: the one place that builds drives (the admin API and the CLI call it).

``imds.services.render.drive`` lays the rendered documents out, ``imds.configdrive`` writes
the ISO; this module picks the format, reads the record (which must have metadata) and
keeps the CPU work off the loop.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from imds.configdrive import MEDIA_TYPE, iso_bytes
from imds.errors import InvalidInput
from imds.models import METADATA, Instance
from imds.services.records.upsert import Records
from imds.services.render.drive import CONFIG_2, FORMATS, LABELS, NOCLOUD, Format, layout

__all__ = ["CONFIG_2", "FORMATS", "LABELS", "MEDIA_TYPE", "NOCLOUD", "Drive", "build_drive", "drive_format", "image"]


@dataclass(frozen=True)
class Drive:
    """A built image: whose, which format, its volume label and bytes."""

    instance_id: str
    fmt: Format
    data: bytes

    @property
    def label(self) -> str:
        """The ISO volume label (``config-2`` or ``cidata``)."""
        return LABELS[self.fmt]

    @property
    def filename(self) -> str:
        """A download name: ``<id>-<format>.iso``."""
        return f"{self.instance_id}-{self.fmt}.iso"


def image(instance: Instance, fmt: Format = CONFIG_2) -> bytes:
    """The ISO image of a drive of format ``fmt`` (``config-2`` or ``nocloud``) for ``instance``."""
    return iso_bytes(layout(instance, fmt), LABELS[fmt])


def drive_format(name: str, field: str = "format") -> Format:
    """The format called ``name``, or InvalidInput naming ``field``."""
    found = next((known for known in FORMATS if known == name), None)
    if found is None:
        raise InvalidInput.one(field, f"must be one of {', '.join(FORMATS)}")
    return found


async def build_drive(records: Records, instance_id: str, fmt: Format = CONFIG_2) -> Drive:
    """The drive of ``instance_id`` (RecordNotFound without metadata), built in a worker thread."""
    instance = await records.get(METADATA, instance_id)
    data = await asyncio.to_thread(image, instance, fmt)  # pycdlib is CPU work: keep the loop free
    return Drive(instance.id, fmt, data)
