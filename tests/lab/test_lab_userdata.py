"""The operator's ``--userdata`` reaches cloud-init unchanged, with the lab's marker part beside it.

cloud-init's own parser (Debian's, under the system python) splits what the lab sends: the
operator's part must come out byte for byte with the type cloud-init would have given it
alone, and the lab's marker script must be a second shell script that sorts last.
"""

from __future__ import annotations

import gzip
import json
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from pathlib import Path
from typing import Any

import pytest

from cloudinit_guard import run_cloud_init
from imds.lab.userdata import MARKER_SCRIPT, content_type, marker_script, with_marker

PARSE = r"""
import base64, json, sys
cfg = json.loads(sys.argv[1])
from cloudinit import helpers, user_data
paths = helpers.Paths({"cloud_dir": cfg["tmp"] + "/cloud", "run_dir": cfg["tmp"] + "/run"})
msg = user_data.UserDataProcessor(paths).process(base64.b64decode(cfg["blob"]))
parts = []
for part in msg.walk():
    if part.get_content_maintype() == "multipart":
        continue
    parts.append({"type": part.get_content_type(), "filename": part.get_filename(),
                  "payload": base64.b64encode(part.get_payload(decode=True)).decode()})
print(json.dumps(parts))
"""

SCRIPT = b"#!/bin/sh\necho 'HIDDEN-CHECK' \"$(hostname)\" > /dev/ttyS0\n"
CLOUD_CONFIG = b"#cloud-config\nruncmd:\n  - [sh, -c, 'echo OPERATOR > /dev/ttyS0']\nfinal_message: done\n"


def parsed(tmp_path: Path, blob: bytes) -> list[dict[str, Any]]:
    """What cloud-init's UserDataProcessor makes of ``blob``: each leaf part's type, file name and bytes."""
    import base64  # noqa: PLC0415 - only here

    got = run_cloud_init(PARSE, {"tmp": str(tmp_path), "blob": base64.b64encode(blob).decode()}, tmp_path, 60)
    parts: list[dict[str, Any]] = json.loads(json.dumps(got))
    for part in parts:
        part["payload"] = base64.b64decode(part["payload"])
    return parts


@pytest.mark.parametrize(("given", "mime"), [(SCRIPT, "text/x-shellscript"), (CLOUD_CONFIG, "text/cloud-config")])
def test_cloud_init_gets_the_operators_part_unchanged_and_the_marker_script_last(tmp_path, given, mime):
    """Two parts: the operator's bytes with cloud-init's own type for them, then the lab's script."""
    parts = parsed(tmp_path, with_marker(given, "MARK-1"))
    assert [p["type"] for p in parts] == [mime, "text/x-shellscript"]
    assert parts[0]["payload"] == given
    assert parts[1]["payload"] == marker_script("MARK-1").encode()
    assert parts[1]["filename"] == MARKER_SCRIPT
    assert max([parts[0]["filename"], "runcmd", MARKER_SCRIPT]) == MARKER_SCRIPT  # runs after the operator's


def test_the_operators_userdata_alone_is_typed_the_same_by_cloud_init(tmp_path):
    """The type the lab gives each start is the one cloud-init gives the same userdata sent alone."""
    for given in (SCRIPT, CLOUD_CONFIG, b"#cloud-boothook\n#!/bin/sh\ntrue\n"):
        (alone,) = parsed(tmp_path, given)
        assert content_type(given.decode()) == alone["type"]
        assert alone["payload"] == given


def test_gzip_and_multipart_userdata_are_kept_whole(tmp_path):
    """Gzip is opened first; an operator's own multipart is nested and each of its parts survives."""
    assert next(p["payload"] for p in parsed(tmp_path, with_marker(gzip.compress(SCRIPT)))) == SCRIPT
    own = MIMEMultipart()
    for text, subtype in ((CLOUD_CONFIG, "cloud-config"), (SCRIPT, "x-shellscript")):
        own.attach(MIMEText(text.decode(), subtype))
    parts = parsed(tmp_path, with_marker(own.as_bytes()))
    assert [(p["type"], p["payload"]) for p in parts[:2]] == [("text/cloud-config", CLOUD_CONFIG),
                                                              ("text/x-shellscript", SCRIPT)]
    assert parts[2]["filename"] == MARKER_SCRIPT
