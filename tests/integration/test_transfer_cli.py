"""``imds import`` / ``imds export``: files, arrays, directories and stdin, on the database and a live server."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import tempfile
from pathlib import Path

import httpx
import pytest

from factories import new_id, next_ipv4
from serve_process import ADMIN_TOKEN, IMDS, clean_env, run_imds, serving


def imds(*args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """The real executable with a clean environment (it configures logging for its process)."""
    with tempfile.TemporaryDirectory(prefix="imds-transfer-") as home:
        return subprocess.run([str(IMDS), *args], input=stdin, env=clean_env(Path(home), **env), capture_output=True,
                              text=True, timeout=120, check=False)


def upsert(instance_id: str, ip: str, **parts) -> dict:
    return {"id": instance_id, "ipAddresses": [ip], **parts}


@pytest.fixture
def data(tmp_path) -> str:
    """A migrated, empty SQLite data directory."""
    path = tmp_path / "data"
    assert imds("db", "upgrade", "--data-dir", str(path)).returncode == 0
    return str(path)


@pytest.fixture
def fleet():
    """Three good instances (metadata + text userdata, metadata only, binary userdata only)."""
    a, b, c = new_id(), new_id(), new_id()
    return [
        upsert(a, next_ipv4(), metadata={"id": a, "hostname": "a"}, userdata="#cloud-config\n",
               userdata_encoding="text"),
        upsert(b, next_ipv4(), metadata={"id": b, "hostname": "b", "facility": "da11"}),
        upsert(c, next_ipv4(), userdata="AP8=", userdata_encoding="base64"),
    ]


def jsonl(items) -> str:
    return "".join(json.dumps(item) + "\n" for item in items)


def test_import_reports_each_outcome_with_line_numbers_then_a_rerun_is_all_unchanged(tmp_path, data, fleet):
    """Created, rejected (line + id + reason), exit 1; the same file again: everything unchanged, nothing written."""
    source = tmp_path / "fleet.jsonl"
    bad_ip = upsert(new_id(), "x")
    bad_ip["metadata"] = {}
    source.write_text(jsonl(fleet[:2]) + "\n" + json.dumps(bad_ip) + "\n{oops\n" + jsonl(fleet[2:]))
    first = imds("import", str(source), "--data-dir", data)
    assert first.returncode == 1, first.stderr
    lines = first.stdout.splitlines()
    assert lines[0].startswith("3 created, 0 updated, 0 unchanged, 0 stale, 2 rejected in ")
    assert lines[1:] == [
        f"rejected line 4 ({bad_ip['id']}): ipAddresses[0]: 'x' is not an IP address or CIDR",
        "rejected line 5: json: not valid JSON: Expecting property name enclosed in double quotes at column 2",
    ]
    again = imds("import", str(source), "--data-dir", data)
    assert again.stdout.splitlines()[0].startswith("0 created, 0 updated, 3 unchanged, 0 stale, 2 rejected")
    good = tmp_path / "good.jsonl"
    changed = [*fleet]
    changed[1] = {**fleet[1], "metadata": {**fleet[1]["metadata"], "plan": "c3"}}
    good.write_text(jsonl(changed))
    third = imds("import", str(good), "--data-dir", data)
    assert third.returncode == 0, third.stdout
    assert third.stdout.splitlines()[0].startswith("0 created, 1 updated, 2 unchanged, 0 stale, 0 rejected")


def test_export_round_trips_through_every_format(tmp_path, data, fleet):
    """Export (jsonl, json array, a directory) → import into an empty database → export: the same bytes."""
    source = tmp_path / "fleet.jsonl"
    source.write_text(jsonl(fleet))
    assert imds("import", str(source), "--data-dir", data).returncode == 0
    exported = imds("export", "--data-dir", data)
    assert exported.returncode == 0, exported.stderr
    assert exported.stderr.splitlines()[-1] == "exported 3 instances"
    records = [json.loads(line) for line in exported.stdout.splitlines()]
    assert {r["id"]: r for r in records} == {
        fleet[0]["id"]: fleet[0], fleet[1]["id"]: fleet[1], fleet[2]["id"]: fleet[2],
    }
    for fmt in ("json", "dir", "jsonl"):
        target = tmp_path / f"out-{fmt}"
        assert imds("export", str(target), "--format", fmt, "--data-dir", data).returncode == 0
        fresh = tmp_path / f"fresh-{fmt}"
        assert imds("db", "upgrade", "--data-dir", str(fresh)).returncode == 0
        loaded = imds("import", str(target), "--data-dir", str(fresh))
        assert loaded.stdout.splitlines()[0].startswith("3 created, 0 updated, 0 unchanged"), (fmt, loaded.stdout)
        assert imds("export", "--data-dir", str(fresh)).stdout == exported.stdout
    assert sorted(p.name for p in (tmp_path / "out-dir").iterdir()) == sorted(f"{r['id']}.json" for r in fleet)


def test_dry_run_and_strict_write_nothing(tmp_path, data, fleet):
    """--dry-run reports what would happen; --strict with one bad item rejects the whole file; stdin works."""
    dry = imds("import", "-", "--data-dir", data, "--dry-run", stdin=jsonl(fleet))
    assert dry.returncode == 0, dry.stdout
    assert dry.stdout.splitlines() == [
        "3 created, 0 updated, 0 unchanged, 0 stale, 0 rejected (dry run: nothing written)",
    ]
    strict = imds("import", "-", "--data-dir", data, "--strict", stdin=jsonl(fleet) + '{"id": "nope"}\n')
    assert strict.returncode == 1
    assert strict.stdout.splitlines() == [
        "0 created, 0 updated, 0 unchanged, 0 stale, 1 rejected (--strict: nothing written)",
        "rejected line 4 (nope): metadata: or userdata is required (an item carries at least one)",
    ]
    assert imds("export", "--data-dir", data).stdout == ""


def test_a_stale_document_is_reported_not_written(tmp_path, data):
    """An item whose metadata updated_at is older than the stored one is "stale", with the reason."""
    instance_id, ip = new_id(), next_ipv4()
    newer = upsert(instance_id, ip, metadata={"updated_at": "2026-01-02T00:00:00Z", "v": 2})
    older = upsert(instance_id, ip, metadata={"updated_at": "2026-01-01T00:00:00Z", "v": 1})
    assert imds("import", "-", "--data-dir", data, stdin=jsonl([newer])).returncode == 0
    ran = imds("import", "-", "--data-dir", data, stdin=jsonl([older]))
    assert ran.stdout.splitlines() == [
        ran.stdout.splitlines()[0],
        (f"stale line 1 ({instance_id}): stale: updated_at 2026-01-01T00:00:00Z is older than the stored "
         "2026-01-02T00:00:00Z"),
    ]
    assert ran.stdout.startswith("0 created, 0 updated, 0 unchanged, 1 stale, 0 rejected")


def test_plain_progress_lines_when_not_on_a_terminal(tmp_path, data, fleet):
    """When stderr is not a TTY, progress comes as plain lines (every batch with a zero interval)."""
    ran = imds("import", "-", "--data-dir", data, "--batch-size", "2", "--progress-interval", "0",
               stdin=jsonl(fleet))
    progress = [line for line in ran.stderr.splitlines() if line.startswith("imds import:")]
    assert [line.split(" (")[0] for line in progress] == ["imds import: 2 items", "imds import: 3 items"]


def test_import_and_export_against_a_live_server(tmp_path, fleet):
    """--url: batches go to POST /device-records; the server serves them at once; a re-run is unchanged.

    More than one batch is more than one transaction on the server: refused without --partial.
    """
    with serving(tmp_path, "--data-dir", str(tmp_path / "served")) as server:
        env = {"IMDS_ADMIN_TOKEN": ADMIN_TOKEN}
        first = imds("import", "-", "--url", server.url, stdin=jsonl(fleet), **env)
        assert first.returncode == 0, (first.stdout, first.stderr)
        assert first.stdout.startswith("3 created, 0 updated, 0 unchanged, 0 stale, 0 rejected")
        with httpx.Client(timeout=10) as client:
            answer = client.get(f"{server.url}/device-metadata/{fleet[1]['id']}", headers=server.admin_headers)
        assert answer.json() == fleet[1]["metadata"]
        again = imds("import", "-", "--url", server.url, stdin=jsonl(fleet), **env)
        assert again.stdout.startswith("0 created, 0 updated, 3 unchanged")
        remote = imds("export", "--url", server.url, **env)
        local = imds("export", "--data-dir", str(tmp_path / "served"))
        assert remote.returncode == 0, remote.stderr
        assert remote.stdout == local.stdout
        assert len(remote.stdout.splitlines()) == 3
        many = [upsert(new_id(), next_ipv4(), metadata={"hostname": f"n{n}"}) for n in range(3)]
        refused = imds("import", "-", "--url", server.url, "--batch-size", "2", stdin=jsonl(many), **env)
        assert refused.returncode == 2  # two requests, two transactions: only with --partial
        assert "give --partial" in refused.stderr
        with httpx.Client(timeout=10) as client:
            absent = client.get(f"{server.url}/device-metadata/{many[0]['id']}", headers=server.admin_headers)
        assert absent.status_code == 404
        partial = imds("import", "-", "--url", server.url, "--batch-size", "2", "--partial", stdin=jsonl(many),
                       **env)
        assert partial.stdout.startswith("3 created"), (partial.stdout, partial.stderr)


@pytest.mark.parametrize("command", ["import", "export"])
def test_help(command, tmp_path):
    """--help names the targets and the options."""
    result = run_imds(tmp_path, command, "--help")
    assert result.returncode == 0, result.stderr
    for flag in ("--db", "--data-dir", "--url", "--token"):
        assert flag in result.stdout
    for flag in {"import": ("--dry-run", "--strict", "--batch-size", "--partial"), "export": ("--format",)}[command]:
        assert flag in result.stdout


def test_a_progress_bar_on_a_terminal(tmp_path, data, fleet):
    """With stderr on a terminal (a pty here) the bar shows count and rate; stdout keeps only the summary."""
    source = tmp_path / "fleet.jsonl"
    source.write_text(jsonl(fleet))
    master, terminal = pty.openpty()
    try:
        with tempfile.TemporaryDirectory(prefix="imds-transfer-") as home:
            env = clean_env(Path(home), COLUMNS="120", TERM="xterm")
            process = subprocess.Popen(
                [str(IMDS), "import", str(source), "--data-dir", data, "--batch-size", "1", "--log-level", "warning"],
                stdout=subprocess.PIPE, stderr=terminal, env=env,
            )
            os.close(terminal)
            terminal = -1
            stdout, _ = process.communicate(timeout=60)
        drawn = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the other side is closed: everything was read
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(master)
        if terminal != -1:
            os.close(terminal)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", drawn.decode(errors="replace"))
    assert process.returncode == 0
    assert stdout.decode().startswith("3 created, 0 updated, 0 unchanged")
    assert "importing" in text
    assert "3/3" in text
    assert "/s" in text
