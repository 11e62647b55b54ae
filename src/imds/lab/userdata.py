"""The userdata a lab guest gets: the lab's own, or the operator's with the lab's marker beside it.

The lab passes a guest when its userdata's marker reaches the console. With ``--userdata FILE``
the operator's userdata is sent unchanged as the first part of a MIME multipart (the form
cloud-init documents for several parts), and a second part, a shell script, prints the marker
and the hostname to the console once cloud-init's ``scripts-user`` has run the operator's
scripts (cloud-init runs them sorted by file name; the lab's is named to come last). So a
passing boot proves cloud-init processed the operator's userdata, whatever it is: cloud-config,
a script, a boothook, an ``#include``, or a multipart of its own (nested as it is). Gzip-
compressed userdata is decompressed first, as cloud-init itself would. The lab's own parts
(``--ganeti-install``'s script) go between the operator's userdata and the marker script.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from email import message_from_bytes, policy
from email.message import Message
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText

MARKER = "LAB-MARKER"
MARKER_SCRIPT = "zz-imds-lab-marker.sh"  # sorts after part-NNN and runcmd in cloud-init's scripts dir
GZIP_MAGIC = b"\x1f\x8b"

# cloud-init's starts (cloudinit/handlers/__init__.py INCLUSION_TYPES_MAP), longest first.
STARTS: tuple[tuple[str, str], ...] = (
    ("#cloud-config-archive", "text/cloud-config-archive"),
    ("#cloud-config-jsonp", "text/cloud-config-jsonp"),
    ("#cloud-config", "text/cloud-config"),
    ("#cloud-boothook", "text/cloud-boothook"),
    ("#include-once", "text/x-include-once-url"),
    ("#include", "text/x-include-url"),
    ("#part-handler", "text/part-handler"),
    ("#upstart-job", "text/upstart-job"),
    ("#!", "text/x-shellscript"),
)


def default_userdata(marker: str = MARKER) -> bytes:
    """Cloud-config whose runcmd prints the marker and the hostname the guest has by then to the console."""
    return (f"#cloud-config\nruncmd:\n  - [sh, -c, 'echo {marker} host=$(hostname) > /dev/ttyS0']\n").encode()


def marker_script(marker: str = MARKER) -> str:
    """The lab's part: print the marker and the guest's hostname to the serial console."""
    return f'#!/bin/sh\necho "{marker} host=$(hostname)" > /dev/ttyS0\n'


def content_type(text: str) -> str:
    """The MIME type cloud-init gives userdata starting with ``text`` (``text/plain`` when it knows none)."""
    for start, mime in STARTS:
        if text.startswith(start):
            return mime
    return "text/plain"


def with_marker(userdata: bytes, marker: str = MARKER) -> bytes:
    """``userdata`` as the first part of a multipart whose second part prints ``marker`` to the console."""
    return lab_userdata(userdata, marker)


def lab_userdata(userdata: bytes | None, marker: str = MARKER, scripts: Sequence[tuple[str, str]] = (),
                 configs: Sequence[str] = ()) -> bytes:
    """What the guest gets: the operator's userdata (or the default) and the lab's ``scripts`` (name, text).

    Without operator userdata and scripts: the default cloud-config alone. Otherwise a multipart:
    the operator's userdata (or the default cloud-config, which prints the marker itself), each
    of ``scripts`` as a shell-script part under its name, and, after the operator's userdata,
    the marker script, whose name sorts last. ``configs`` are cloud-config parts of the lab's own
    (each with keys the operator's part is unlikely to set: cloud-init merges them, a list key
    given twice is replaced).
    """
    if userdata is None and not scripts and not configs:
        return default_userdata(marker)
    if userdata is not None and userdata.startswith(GZIP_MAGIC):
        userdata = gzip.decompress(userdata)
    outer = MIMEMultipart()
    outer.attach(_part(default_userdata(marker) if userdata is None else userdata))
    for index, text in enumerate(configs):
        config = MIMEText(text, "cloud-config", "utf-8")
        config.add_header("Content-Disposition", "attachment", filename=f"zz-imds-lab-{index}.cfg")
        outer.attach(config)
    for name, text in scripts:
        outer.attach(_script(name, text))
    if userdata is not None:
        outer.attach(_script(MARKER_SCRIPT, marker_script(marker)))
    return outer.as_bytes()


def _script(name: str, text: str) -> Message:
    part = MIMEText(text, "x-shellscript", "utf-8")
    part.add_header("Content-Disposition", "attachment", filename=name)
    return part


def _part(userdata: bytes) -> Message:
    text = userdata.decode("utf-8", errors="surrogateescape")
    if text.lower().startswith(("content-type:", "mime-version:")):
        return message_from_bytes(userdata, policy=policy.compat32)
    subtype = content_type(text).split("/", 1)[1]
    part = MIMEText(text, subtype, "utf-8")
    part.add_header("Content-Disposition", "attachment", filename="part-001")
    return part
