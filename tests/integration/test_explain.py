"""``imds explain`` and ``GET /explain``: the entry an address resolves through, the others, upstream, previews."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from factories import new_id
from fake_upstream import running_upstream
from serve_process import ADMIN_TOKEN, client_at, run_imds, serving

OS = {"os_type": "debootstrap+default", "mode": "install", "communication": False,
      "parameters": {"dns": {"value": "10.9.0.2", "visibility": "public"},
                     "root_hash": {"value": "private-hash-value", "visibility": "private"}}}


def _fleet(prefix: str) -> tuple[str, str, list[dict]]:
    host, net = new_id(), new_id()
    return host, net, [
        {"id": host, "ipAddresses": [f"{prefix}.5"], "metadata": {"id": host, "hostname": "web-1"},
         "userdata": "#cloud-config\n", "os": OS},
        {"id": net, "ipAddresses": [f"{prefix}.0/24"], "metadata": {"id": net, "hostname": "pool"}},
    ]


@pytest.fixture
def stored(tmp_path) -> tuple[str, str, str]:
    """A data dir with a host entry 10.77.1.5 (web-1, with an OS record) inside a CIDR 10.77.1.0/24 (pool)."""
    data = str(tmp_path / "data")
    assert run_imds(tmp_path, "db", "upgrade", "--data-dir", data).returncode == 0
    host, net, items = _fleet("10.77.1")
    (tmp_path / "fleet.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    done = run_imds(tmp_path, "import", str(tmp_path / "fleet.jsonl"), "--data-dir", data)
    assert done.returncode == 0, done.stderr
    return data, host, net


def _explain(tmp_path: Path, *args: str, **env: str) -> dict:
    done = run_imds(tmp_path, "explain", *args, "-o", "json", **env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_host_entry_wins_over_the_cidr_that_also_contains_it(tmp_path, stored):
    data, host, net = stored
    body = _explain(tmp_path, "10.77.1.5", "--data-dir", data)
    assert body["instance_id"] == host
    assert body["resolved_by"] == "stored entry"
    assert body["matched"] == {"entry": "10.77.1.5", "kind": "host", "prefix": 32, "instance_id": host}
    assert body["also_containing"] == [{"entry": "10.77.1.0/24", "kind": "cidr", "prefix": 24, "instance_id": net}]
    assert body["upstream"]["known"] is False
    previews = body["previews"]
    assert json.loads(previews["json"]) == {"id": host, "hostname": "web-1"}
    assert previews["ec2"]["instance-id"] == host
    assert previews["ec2"]["local-ipv4"] is None  # the document lists no addresses
    assert previews["openstack"]["uuid"] == host
    assert previews["openstack"]["name"] == "web-1"
    assert f"instance-id: {host}" in previews["nocloud"]
    assert previews["ganeti"]["parameters.json"] == {"dns": ["10.9.0.2", "public"],
                                                     "root_hash": ["<private>", "private"]}
    assert "private-hash-value" not in json.dumps(body)


def test_another_address_of_the_cidr_and_an_unknown_one(tmp_path, stored):
    data, _host, net = stored
    body = _explain(tmp_path, "10.77.1.9", "--data-dir", data)
    assert body["matched"]["entry"] == "10.77.1.0/24"
    assert (body["instance_id"], body["also_containing"], body["previews"]["ganeti"]) == (net, [], None)
    nothing = _explain(tmp_path, "10.78.0.1", "--data-dir", data)
    assert (nothing["instance_id"], nothing["matched"], nothing["previews"]) == (None, None, {})
    table = run_imds(tmp_path, "explain", "10.78.0.1", "--data-dir", data)
    assert "instance     none: no stored entry contains it" in table.stdout


def test_by_instance_id_and_as_a_table(tmp_path, stored):
    data, host, _net = stored
    body = _explain(tmp_path, host.upper(), "--data-dir", data)
    assert (body["instance_id"], body["resolved_by"]) == (host, "instance id")
    assert body["instance"]["entries"][0]["entry"] == "10.77.1.5"
    table = run_imds(tmp_path, "explain", "10.77.1.5", "--data-dir", data)
    assert table.returncode == 0, table.stderr
    assert f"instance     {host} (by stored entry)" in table.stdout
    assert "entry        10.77.1.5 (host, /32: the longest prefix)" in table.stdout
    assert "also in      10.77.1.0/24 (cidr, held by" in table.stdout
    assert '"root_hash": ["<private>", "private"]' in table.stdout


def test_bad_queries_are_usage_errors(tmp_path, stored):
    data, *_ = stored
    bad = run_imds(tmp_path, "explain", "web-1", "--data-dir", data)
    assert bad.returncode == 2
    assert "'web-1' is neither an IP address nor an instance id" in bad.stderr
    missing = run_imds(tmp_path, "explain", new_id(), "--data-dir", data)
    assert missing.returncode == 1
    assert "is stored" in missing.stderr


def test_help(tmp_path):
    done = run_imds(tmp_path, "explain", "--help")
    assert done.returncode == 0
    for text in ("IP|ID", "--data-dir", "--url", "--output", "stored entry"):
        assert text in done.stdout


def test_a_live_server_also_tells_what_the_upstream_lookup_did(tmp_path):
    caller = "127.0.0.9"
    pulled = new_id()
    with running_upstream() as upstream:
        upstream.put_metadata(pulled, [caller], {"id": pulled, "hostname": "pulled"}, as_string=True)
        with serving(tmp_path, "--data-dir", str(tmp_path / "served"), "--lookup-url", upstream.base + "/",
                     "--lookup-timeout", "5") as server:
            host, _net, items = _fleet("10.77.2")
            with httpx.Client(timeout=10) as admin:
                answer = admin.post(f"{server.url}/device-records", json=items, headers=server.admin_headers)
                assert answer.status_code == 200, answer.text
                with client_at(caller) as instance:
                    assert instance.get(f"{server.url}/metadata").json()["hostname"] == "pulled"
                by_http = admin.get(f"{server.url}/explain", params={"q": caller}, headers=server.admin_headers)
                unauthorised = admin.get(f"{server.url}/explain", params={"q": caller})
                by_id = admin.get(f"{server.url}/explain/{host}", headers=server.admin_headers)
            assert unauthorised.status_code == 401
            body = by_http.json()
            assert (body["instance_id"], body["matched"]["entry"]) == (pulled, caller)
            assert body["upstream"]["fetched"] == ["metadata"]
            assert by_id.json()["previews"]["ganeti"]["parameters.json"]["root_hash"] == ["<private>", "private"]
            remote = _explain(tmp_path, "10.77.2.5", "--url", server.url, IMDS_ADMIN_TOKEN=ADMIN_TOKEN)
            assert remote["instance_id"] == host
            assert remote["also_containing"][0]["entry"] == "10.77.2.0/24"
            assert remote["upstream"] == {"by_ip_cache": {}, "fetched": []}
