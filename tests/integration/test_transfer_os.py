"""Ganeti OS records in ``imds export`` / ``imds import``: private values unless --no-private, never secrets."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import httpx
from cryptography.fernet import Fernet

from factories import new_id, next_ipv4
from serve_process import ADMIN_TOKEN, IMDS, clean_env, serving

OS = {
    "os_type": "debootstrap+default", "mode": "run", "communication": True,
    "parameters": {
        "dns": {"value": "10.0.0.2", "visibility": "public"},
        "root_hash": {"value": "private-hash-value", "visibility": "private"},
        "api_key": {"value": "secret-key-value", "visibility": "secret"},
    },
    "install_parameters": {"disk": {"value": "/dev/vda", "visibility": "public"}},
    "package": {"url": "https://packages.example/os.tgz"},
}


def imds(*args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="imds-transfer-os-") as home:
        return subprocess.run([str(IMDS), *args], input=stdin, env=clean_env(Path(home), **env), capture_output=True,
                              text=True, timeout=120, check=False)


def jsonl(items) -> str:
    return "".join(json.dumps(item) + "\n" for item in items)


def _data(tmp_path, name: str = "data") -> str:
    path = str(tmp_path / name)
    assert imds("db", "upgrade", "--data-dir", path).returncode == 0
    return path


def _key_file(tmp_path):
    path = tmp_path / "private.keys"
    path.write_text(Fernet.generate_key().decode() + "\n")
    return str(path)


def _items(os_record=OS):
    a, b = new_id(), new_id()
    return [
        {"id": a, "ipAddresses": [next_ipv4()], "metadata": {"id": a, "hostname": "a"}, "os": os_record},
        {"id": b, "ipAddresses": [next_ipv4()], "metadata": {"id": b, "hostname": "b"}},
    ]


def _exported(stdout: str) -> dict[str, dict]:
    return {record["id"]: record for record in map(json.loads, stdout.splitlines())}


def test_export_carries_the_os_record_with_private_values_and_never_secrets(tmp_path):
    data, keys = _data(tmp_path), _key_file(tmp_path)
    items = _items()
    done = imds("import", "-", "--data-dir", data, "--private-key-file", keys, stdin=jsonl(items))
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stdout.startswith("2 created, 0 updated, 0 unchanged, 0 stale, 0 rejected")
    assert "private-hash-value" not in (tmp_path / "data" / "imds.db").read_bytes().decode("latin-1")

    full = imds("export", "--data-dir", data, "--private-key-file", keys)
    assert full.returncode == 0, full.stderr
    record = _exported(full.stdout)[items[0]["id"]]
    assert record["os"]["parameters"] == {
        "dns": {"value": "10.0.0.2", "visibility": "public"},
        "root_hash": {"value": "private-hash-value", "visibility": "private"},
    }
    assert record["os"]["install_parameters"] == OS["install_parameters"]
    assert record["os"]["package"] == {"url": "https://packages.example/os.tgz"}
    assert (record["os"]["mode"], record["os"]["communication"]) == ("run", True)
    assert "secret-key-value" not in full.stdout
    assert "os" not in _exported(full.stdout)[items[1]["id"]]

    public = imds("export", "--no-private", "--data-dir", data, "--private-key-file", keys)
    assert public.returncode == 0, public.stderr
    assert _exported(public.stdout)[items[0]["id"]]["os"]["parameters"] == {
        "dns": {"value": "10.0.0.2", "visibility": "public"}}
    assert "private-hash-value" not in public.stdout

    without_key = imds("export", "--data-dir", data)
    assert without_key.returncode != 0
    assert "root_hash cannot be decrypted" in without_key.stderr
    assert "--no-private" in without_key.stderr


def test_an_export_imports_again_unchanged_and_into_a_new_database(tmp_path):
    """Without secrets, an export re-imports as unchanged (a record with a secret is rewritten: the export lacks it)."""
    data, keys = _data(tmp_path), _key_file(tmp_path)
    parameters = {k: v for k, v in OS["parameters"].items() if v["visibility"] != "secret"}
    items = _items({**OS, "parameters": parameters})
    assert imds("import", "-", "--data-dir", data, "--private-key-file", keys, stdin=jsonl(items)).returncode == 0
    exported = imds("export", "--data-dir", data, "--private-key-file", keys).stdout
    again = imds("import", "-", "--data-dir", data, "--private-key-file", keys, stdin=exported)
    assert again.stdout.startswith("0 created, 0 updated, 2 unchanged"), again.stdout
    other = _data(tmp_path, "other")
    moved = imds("import", "-", "--data-dir", other, stdin=exported)
    assert moved.stdout.startswith("2 created"), (moved.stdout, moved.stderr)
    assert imds("export", "--data-dir", other).stdout == exported
    changed = exported.replace("private-hash-value", "new-hash")
    updated = imds("import", "-", "--data-dir", other, stdin=changed)
    assert updated.stdout.startswith("0 created, 1 updated, 1 unchanged")
    assert "new-hash" in imds("export", "--data-dir", other).stdout


def test_a_bad_os_member_is_rejected_with_its_field(tmp_path):
    item = _items()[0]
    item["os"] = {**OS, "mode": "sideways"}
    done = imds("import", "-", "--data-dir", _data(tmp_path), stdin=jsonl([item]))
    assert done.returncode == 1
    assert f"rejected line 1 ({item['id']}): os.mode: must be one of" in done.stdout


def test_os_records_through_a_live_server(tmp_path):
    keys = _key_file(tmp_path)
    items = _items()
    with serving(tmp_path, "--data-dir", str(tmp_path / "served"), "--private-key-file", keys) as server:
        env = {"IMDS_ADMIN_TOKEN": ADMIN_TOKEN}
        first = imds("import", "-", "--url", server.url, stdin=jsonl(items), **env)
        assert first.stdout.startswith("2 created"), (first.stdout, first.stderr)
        with httpx.Client(timeout=10) as client:
            view = client.get(f"{server.url}/device-os/{items[0]['id']}", headers=server.admin_headers).json()
        assert view["parameters"]["root_hash"] == {"visibility": "private", "value": "<private>"}
        assert view["parameters"]["api_key"] == {"visibility": "secret", "secret_state": "held"}
        again = imds("import", "-", "--url", server.url, stdin=jsonl(items), **env)
        assert again.stdout.startswith("0 created, 1 updated, 1 unchanged"), again.stdout  # a secret always rewrites
        remote = imds("export", "--url", server.url, **env)
        assert _exported(remote.stdout)[items[0]["id"]]["os"]["parameters"]["root_hash"]["value"] == \
            "private-hash-value"
        remote_public = imds("export", "--no-private", "--url", server.url, **env)
        assert "private-hash-value" not in remote_public.stdout
        assert "secret-key-value" not in remote.stdout + remote_public.stdout


def test_private_values_need_an_os_read_scope_and_os_items_an_os_write_scope(tmp_path):
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [
        {"subject": "records-only", "token": "records-only-token-0123456789abcdef",
         "scopes": ["metadata:read:metadata", "metadata:read:userdata",
                    "metadata:create:metadata", "metadata:create:userdata",
                    "metadata:update:metadata", "metadata:update:userdata"]},
        {"subject": "os-reader", "token": "os-reader-token-0123456789abcdef",
         "scopes": ["metadata:read:metadata", "metadata:read:userdata", "metadata:read:os"]},
    ]}))
    items = _items()
    with serving(tmp_path, "--data-dir", str(tmp_path / "served"), "--admin-tokens-file", str(tokens)) as server:
        headers = {"Authorization": "Bearer records-only-token-0123456789abcdef"}
        with httpx.Client(timeout=10) as client:
            refused = client.post(f"{server.url}/device-records", json=items, headers=headers)
            assert refused.status_code == 403, refused.text
            assert "metadata:create:os" in refused.json()["message"]
            admin = client.post(f"{server.url}/device-records", json=items, headers=server.admin_headers)
            assert admin.status_code == 200
            private = client.get(f"{server.url}/device-records", headers=headers)
            assert private.status_code == 403
            assert "metadata:read:os" in private.json()["message"]
            public = client.get(f"{server.url}/device-records", params={"private": "false"}, headers=headers)
            assert public.status_code == 403  # the OS record's public values are an os read too
            assert "metadata:read:os" in public.json()["message"]
            headers = {"Authorization": "Bearer os-reader-token-0123456789abcdef"}
            public = client.get(f"{server.url}/device-records", params={"private": "false"}, headers=headers)
            assert public.status_code == 200
            assert '"os":' in public.text
            assert "private-hash-value" not in public.text
