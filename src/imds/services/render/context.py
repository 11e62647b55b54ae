"""What a rendering takes besides the instance's own record: its project's attributes, its notices, the moment.

The catalog builds one per entry when it renders (``Entry.render_in_context``); the drive
layouts, which hold no live state, render without one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from imds.models import ProjectAttributes
from imds.services.render.timeline import Seen


@dataclass(frozen=True)
class Context:
    """The project's attributes record (if any), the notices reaching the instance as seen at ``now``."""

    project: ProjectAttributes | None = None
    notices: tuple[Seen, ...] = ()
    now: datetime | None = None


NO_CONTEXT = Context()
