"""A node runs imds in ganeti-metad's place with no OS flag: its definitions come from Ganeti's search path.

A real ``imds serve`` with neither ``--os-definitions-dir`` nor ``--ganeti-os-search-path``
(and no ``IMDS_GANETI_OS_SEARCH_PATH``) runs in a private mount namespace where a temp dir
is bind-mounted on ``/srv`` (the host's ``/srv`` is untouched), holding
``/srv/ganeti/os/debootstrap``, the first entry of Ganeti's search path: the definition is
loaded, an OS record must name it, and the instance reads its scripts.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest

from factories import new_id
from serve_process import client_at, serving

GUEST = "127.0.0.8"
# Bind the test's directory on /srv, then exec imds (the PID stopped is imds's own).
ON_SRV = ("unshare", "--mount", "--propagation", "private", "--", "sh", "-c", 'mount --bind "$0" /srv && exec "$@"')


def test_definitions_come_from_ganetis_search_path_with_no_flag(tmp_path: Path):
    """/srv/ganeti/os/debootstrap is served; an os_type the node does not have is refused naming os_type."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("test_ganeti_search_path needs root and unshare (a private mount namespace for /srv)")
    srv = tmp_path / "srv"
    definition = srv / "ganeti" / "os" / "debootstrap"
    definition.mkdir(parents=True)
    for script in ("create", "export", "import", "rename"):
        (definition / script).write_text(f"#!/bin/sh\necho {script} from the search path\n")
    (definition / "ganeti_api_version").write_text("20\n")
    with serving(tmp_path, "--db", "memory://", environment={"IMDS_GANETI_OS_SEARCH_PATH": None},
                 wrap=(*ON_SRV, str(srv))) as server:
        instance_id = new_id()
        server.post("/device-metadata", {"id": instance_id, "ipAddresses": [GUEST], "metadata": {"id": instance_id}})
        with httpx.Client(timeout=10.0, headers=server.admin_headers) as admin:
            loaded = admin.get(f"{server.url}/os-definitions").json()
            refused = admin.post(f"{server.url}/device-os", json={"id": instance_id, "os_type": "not-here",
                                                                   "mode": "install"})
        server.post("/device-os", {"id": instance_id, "os_type": "debootstrap+default", "mode": "install"})
        with client_at(GUEST) as guest:
            create = guest.get(f"{server.url}/ganeti/latest/os/scripts/create", timeout=10.0)
        output = server.output()
    assert [d["name"] for d in loaded["os_definitions"]] == ["debootstrap"], loaded
    assert refused.status_code == 400
    assert [e["field"] for e in refused.json()["errors"]] == ["os_type"]
    assert (create.status_code, create.content) == (200, b"#!/bin/sh\necho create from the search path\n")
    assert '"search_path": ["/srv/ganeti/os", "/usr/local/lib/ganeti/os", "/usr/lib/ganeti/os", ' in output
    assert not Path("/srv/ganeti/os/debootstrap").exists()  # the host's /srv never saw the bind mount
