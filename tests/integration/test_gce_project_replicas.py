"""Two ``imds serve`` replicas on one database: project attributes written through A are served by B.

Within the replica-coherence budget (a ``NOTIFY`` on PostgreSQL, one ``--feed-poll-interval``
on SQLite; polled with a deadline here, never slept on), a held ``wait_for_change`` on B is
woken by the write through A, and B's instance of another project never sees them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from factories import new_id
from helpers import wait_for
from serve_process import Server, client_at, in_background, metric, serving

pytestmark = pytest.mark.stores("sqlite", "postgres")

GUEST, OTHER = "127.0.95.7", "127.0.95.8"
V1 = "/computeMetadata/v1"
GOOGLE = {"Metadata-Flavor": "Google"}
BUDGET = 5.0  # seconds: the feed is polled every 0.1 s here; PostgreSQL wakes B by NOTIFY at once


def admin(server: Server, method: str, path: str, **kwargs: Any) -> httpx.Response:
    with httpx.Client(base_url=server.url, headers=server.admin_headers, timeout=10.0, trust_env=False) as client:
        return client.request(method, path, **kwargs)


def read(server: Server, path: str, source: str = GUEST, **params: str) -> httpx.Response:
    with client_at(source) as guest:
        return guest.get(f"{server.url}{V1}/{path}", params=params, headers=GOOGLE, timeout=60.0)


def test_a_project_write_through_a_reaches_b_and_wakes_its_watch(tmp_path: Path, db_url: str):
    """PUT on A: B serves it within the budget, its held watch answers, the other project's instance sees nothing."""
    args = ("--db", db_url, "--feed-poll-interval", "0.1")
    with serving(tmp_path, *args) as a, serving(tmp_path, *args) as b:
        for ip, project in ((GUEST, "acme-prod"), (OTHER, "other-proj")):
            instance_id = new_id()
            body = {"id": instance_id, "ipAddresses": [ip], "metadata": {"id": instance_id, "project_id": project}}
            assert admin(a, "POST", "/device-metadata", json=body).status_code == 200
        wait_for(lambda: read(b, "project/project-id", OTHER).text == "other-proj", what="B to follow the feed")
        assert read(b, "project/attributes/team").status_code == 404
        etag = read(b, "project/attributes/").headers["etag"]
        held = in_background(lambda: read(b, "project/attributes/", recursive="true", wait_for_change="true",
                                          last_etag=etag, timeout_sec="30"))
        wait_for(lambda: metric(b, "imds_watch_waiting") == 1, what="B to hold the watch")
        put = admin(a, "PUT", "/projects/acme-prod/attributes", json={"team": "infra", "ssh-keys": "al:ssh-rsa AAA"})
        assert put.status_code == 200, put.text
        written = time.monotonic()
        wait_for(lambda: read(b, "project/attributes/team").text == "infra", what="B to serve the write through A",
                 timeout=BUDGET)
        assert time.monotonic() - written < BUDGET
        woken = held.get(timeout=BUDGET)
        assert not isinstance(woken, BaseException), woken
        assert (woken.status_code, woken.json()) == (200, {"team": "infra", "ssh-keys": "al:ssh-rsa AAA"})
        assert woken.headers["etag"] != etag
        assert read(b, "project/attributes/team", OTHER).status_code == 404
        assert read(b, "project/attributes/", OTHER).text == ""
        assert admin(b, "GET", "/projects/acme-prod/attributes").json()["revision"] == 1
        assert admin(b, "DELETE", "/projects/acme-prod/attributes").status_code == 200
        wait_for(lambda: read(a, "project/attributes/team").status_code == 404, what="A to follow the delete on B",
                 timeout=BUDGET)
