"""The errors ``imds guest`` raises, each with a one-line message for stderr.

::

    GuestError            message for stderr (udev: exit status 2)
    ├── SourceError       the metadata could not be read (config drive, URL, JSON shape)
    │   └── ServiceError  ganeti install: the metadata service failed a request
    │       └── NotServed     … with a 404 (no install under way, or no such file)
    ├── ApplyError        the rules could not be written, or udevadm failed
    └── InstallError      ganeti install: a step failed (the image, the package, the create script)
"""

from __future__ import annotations


class GuestError(Exception):
    """Base class; ``str(exc)`` is the one-line message shown to the operator."""


class SourceError(GuestError):
    """The device role tags could not be read: missing drive, HTTP error, malformed JSON."""


class ServiceError(SourceError):
    """A request to the metadata service's ``/ganeti`` paths failed (HTTP error, timeout, short body)."""


class NotServed(ServiceError):
    """The service answered 404: nothing is served there for this instance."""


class ApplyError(GuestError):
    """The rules file could not be written, or ``udevadm`` could not reload udev."""


class InstallError(GuestError):
    """A step of ``ganeti install`` failed; ``code`` is the create script's exit status when it was the cause."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code
