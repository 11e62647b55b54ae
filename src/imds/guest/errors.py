"""The errors ``imds guest`` raises; each one ends the run with exit status 2.

::

    GuestError            message for stderr
    ├── SourceError       the metadata could not be read (config drive, URL, JSON shape)
    └── ApplyError        the rules could not be written, or udevadm failed
"""

from __future__ import annotations


class GuestError(Exception):
    """Base class; ``str(exc)`` is the one-line message shown to the operator."""


class SourceError(GuestError):
    """The device role tags could not be read: missing drive, HTTP error, malformed JSON."""


class ApplyError(GuestError):
    """The rules file could not be written, or ``udevadm`` could not reload udev."""
