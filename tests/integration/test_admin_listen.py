"""``--admin-listen``: the admin API on its own listener, instances alone on ``--listen``.

Against real ``imds serve`` processes (the front, and granian and uvicorn once): an admin write
made on the admin port is what an instance reads on the instance port; admin paths on the instance port
and instance paths on the admin port are 404 with a JSON body; probes answer on both;
IPv6 and ``--workers 2`` work; the same address for both is refused at start.
"""

from __future__ import annotations

import httpx
import pytest

from factories import new_id
from helpers import wait_for
from serve_process import ADMIN_TOKEN, client_at, free_port, run_imds, serving

GUEST = "127.0.0.2"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
BOUND = 15.0  # seconds for a write to reach every worker (each follows the change feed)


def _served(guest: httpx.Client, url: str, hostname: str) -> None:
    """Poll (bounded) until ``url`` serves the document with ``hostname`` (another worker may lag a poll)."""
    wait_for(lambda: guest.get(url).json().get("hostname") == hostname,
             what=f"{url} to serve hostname {hostname}", timeout=BOUND)


def _write(admin_url: str, address: str = GUEST) -> str:
    """An instance at ``address`` whose hostname is its id (so a read shows which record it got)."""
    instance_id = new_id()
    body = {"id": instance_id, "ipAddresses": [address], "metadata": {"hostname": instance_id}}
    with httpx.Client(timeout=10.0, trust_env=False) as admin:
        answer = admin.post(f"{admin_url}/device-metadata", json=body, headers=AUTH)
    assert answer.status_code == 200, answer.text
    return instance_id


def _check_split(instance_url: str, admin_url: str, source: str = GUEST) -> None:
    """The record written on the admin port is served on the instance port; each refuses the other's paths."""
    instance_id = _write(admin_url, source)
    with client_at(source) as guest:
        _served(guest, f"{instance_url}/metadata", instance_id)
        for path in ("/device-metadata", "/ui", "/openapi.json", "/metrics", f"/device-metadata/{instance_id}"):
            refused = guest.get(f"{instance_url}{path}", headers=AUTH)
            assert (refused.status_code, refused.json()) == (404, {"message": "not found"}), path
        assert guest.get(f"{instance_url}/healthz").status_code == 200
    with httpx.Client(timeout=10.0, trust_env=False, headers=AUTH) as admin:
        assert admin.get(f"{admin_url}/metadata").status_code == 404
        assert admin.get(f"{admin_url}/latest/meta-data/instance-id").json() == {"message": "not found"}
        _served(admin, f"{admin_url}/device-metadata/{instance_id}", instance_id)
        assert "imds_http_requests_total" in admin.get(f"{admin_url}/metrics").text
        assert admin.get(f"{admin_url}/readyz").status_code == 200


@pytest.mark.parametrize("server", ["front", "granian", "uvicorn"])
def test_admin_api_only_on_its_listener(tmp_path, server):
    """IPv4: the admin port writes, the instance port reads; neither serves the other's paths."""
    port = free_port()
    with serving(tmp_path, "--admin-listen", f"127.0.0.1:{port}", "--server", server) as imds:
        _check_split(imds.url, f"http://127.0.0.1:{port}")
        assert "admin API" in imds.output()


def test_admin_listener_on_ipv6_with_two_workers(tmp_path):
    """IPv6 admin listener, IPv6 instance caller (::1), two workers sharing SQLite."""
    port = free_port("::1")
    db = f"sqlite:///{tmp_path / 'imds.db'}"
    with serving(tmp_path, "--admin-listen", f"[::1]:{port}", "--workers", "2", "--db", db, v6=True) as imds:
        assert imds.v6 is not None
        admin_url = f"http://[::1]:{port}"
        for _ in range(4):  # connections land on either worker
            _check_split(imds.v6, admin_url, source="::1")
        assert imds.stop() == 0


def test_same_address_for_both_is_refused(tmp_path):
    """One address cannot be both: a clear error naming --admin-listen, nothing started."""
    port = free_port()
    done = run_imds(tmp_path, "serve", "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{port}")
    assert done.returncode != 0
    assert f"--admin-listen / IMDS_ADMIN_LISTEN: 127.0.0.1:{port} is also a --listen address" in done.stderr
