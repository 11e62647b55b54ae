"""Lifecycle notices through ``imds export`` and ``imds import``: on the database and between live servers.

A notice goes out as one ``{"notice": {...}}`` line after the instances (its stored state,
times, revision and the guests' acknowledgements) and comes back as it was: a second import
is ``unchanged``, an export of the imported database is byte for byte the first, and a
server fed through ``--url`` serves the notice to the instance as the first one did.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from factories import new_id
from notice_clients import admin
from serve_process import ADMIN_TOKEN, Server, client_at, run_imds, serving

GUEST = "127.0.89.7"


def seeded(server: Server) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """One instance, a maintenance notice for its project (acknowledged by it) and a canceled spot stop."""
    instance_id = new_id()
    server.post("/device-metadata", {"id": instance_id, "ipAddresses": [GUEST],
                                     "metadata": {"id": instance_id, "project_id": "acme"}})
    maintenance = admin(server, "POST", "/device-notices", json={
        "project_id": "acme", "kind": "maintenance", "time": "2030-01-01T02:00:00Z",
        "window_end": "2030-01-01T04:00:00Z", "description": "kernel"})
    stop = admin(server, "POST", "/device-notices", json={"instance_id": instance_id, "kind": "stop",
                                                          "time": "2030-01-01T01:00:00Z"})
    admin(server, "PATCH", f"/device-notices/{stop['id']}", json={"state": "canceled"})
    with client_at(GUEST) as guest:
        acked = guest.post(f"{server.url}/events", json={"state": "notice-ack", "message": maintenance["id"]})
    assert acked.status_code == 200, acked.text
    return instance_id, maintenance, stop


def test_export_and_import_on_the_database(tmp_path: Path):
    """Notices follow the instances; a re-import is unchanged; the imported database exports the same bytes."""
    data = tmp_path / "data"
    with serving(tmp_path, "--data-dir", str(data)) as server:
        _instance_id, maintenance, stop = seeded(server)
    exported = run_imds(tmp_path, "export", "--data-dir", str(data))
    assert exported.returncode == 0, exported.stderr
    assert exported.stderr.splitlines()[-1] == "exported 1 instance and 2 notices"
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    notices = {line["notice"]["id"]: line["notice"] for line in lines if "notice" in line}
    assert set(notices) == {maintenance["id"], stop["id"]}
    assert (notices[stop["id"]]["state"], notices[stop["id"]]["revision"]) == ("canceled", 2)
    assert [a["instance_id"] for a in notices[maintenance["id"]]["acknowledgements"]] == [_instance_id]
    source = tmp_path / "fleet.jsonl"
    source.write_text(exported.stdout)
    fresh = tmp_path / "fresh"
    assert run_imds(tmp_path, "db", "upgrade", "--data-dir", str(fresh)).returncode == 0
    first = run_imds(tmp_path, "import", str(source), "--data-dir", str(fresh))
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.startswith("3 created, 0 updated, 0 unchanged, 0 stale, 0 rejected")
    again = run_imds(tmp_path, "import", str(source), "--data-dir", str(fresh))
    assert again.stdout.startswith("0 created, 0 updated, 3 unchanged, 0 stale, 0 rejected"), again.stdout
    assert run_imds(tmp_path, "export", "--data-dir", str(fresh)).stdout == exported.stdout
    bare = run_imds(tmp_path, "export", "--no-notices", "--data-dir", str(fresh))
    assert bare.stderr.splitlines()[-1] == "exported 1 instance"
    assert all("notice" not in json.loads(line) for line in bare.stdout.splitlines())
    folder = tmp_path / "dir"
    assert run_imds(tmp_path, "export", str(folder), "--format", "dir", "--data-dir", str(fresh)).returncode == 0
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [f"{_instance_id}.json", *(f"notice-{n}.json" for n in notices)])


def test_a_bad_notice_line_is_rejected_naming_the_field(tmp_path: Path):
    """The import names the notice's bad field (line and id) and writes nothing of it."""
    fresh = tmp_path / "fresh"
    assert run_imds(tmp_path, "db", "upgrade", "--data-dir", str(fresh)).returncode == 0
    source = tmp_path / "bad.jsonl"
    source.write_text(json.dumps({"notice": {"id": "0d59937288b749b32", "scope": "project", "project_id": "acme",
                                             "kind": "maintenance", "time": "2030-01-01T02:00:00Z",
                                             "state": "scheduled"}}) + "\n")
    done = run_imds(tmp_path, "import", str(source), "--data-dir", str(fresh))
    assert done.returncode == 1
    assert "rejected line 1" in done.stdout
    assert "notice.window_end" in done.stdout


@pytest.mark.parametrize("dry_run", [False, True])
def test_between_live_servers_with_url(tmp_path: Path, dry_run: bool):
    """Export --url from A, import --url into B: B serves the notices to the instance (a dry run writes none)."""
    with serving(tmp_path, "--data-dir", str(tmp_path / "a")) as a, \
            serving(tmp_path, "--data-dir", str(tmp_path / "b")) as b:
        _instance_id, maintenance, _stop = seeded(a)
        token = {"IMDS_ADMIN_TOKEN": ADMIN_TOKEN}
        exported = run_imds(tmp_path, "export", "--url", a.url, **token)
        assert exported.returncode == 0, exported.stderr
        source = tmp_path / "from-a.jsonl"
        source.write_text(exported.stdout)
        args = ("--dry-run",) if dry_run else ()
        loaded = run_imds(tmp_path, "import", str(source), "--url", b.url, *args, **token)
        assert loaded.returncode == 0, loaded.stdout + loaded.stderr
        assert loaded.stdout.startswith("3 created")
        with httpx.Client(headers=b.admin_headers, trust_env=False) as client:
            found = client.get(f"{b.url}/device-notices/{maintenance['id']}")
        if dry_run:
            assert found.status_code == 404
            return
        assert found.json()["acknowledgements"] == admin(a, "GET", f"/device-notices/{maintenance['id']}")[
            "acknowledgements"]
        with client_at(GUEST) as guest:
            scheduled = guest.get(f"{b.url}/latest/meta-data/events/maintenance/scheduled").json()
        assert [e["EventId"] for e in scheduled] == [f"instance-event-{maintenance['id']}"]
