"""Two ``imds serve`` processes on one database: a secret lives only in the replica that received it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from factories import new_id
from helpers import wait_for
from serve_process import Server, client_at, serving

PARAMS = "/ganeti/latest/os/parameters.json"
GUEST = "127.0.93.7"


def admin(server: Server, method: str, path: str, **kwargs: Any) -> httpx.Response:
    with httpx.Client(base_url=server.url, headers=server.admin_headers, timeout=10.0, trust_env=False) as client:
        return client.request(method, path, **kwargs)


def served(server: Server) -> httpx.Response:
    with client_at(GUEST) as client:
        return client.get(f"{server.url}{PARAMS}")


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_replica_without_the_secret_serves_it_absent(tmp_path: Path, request: pytest.FixtureRequest, backend: str):
    """A serves the secret it received; B serves the record without it and reports it lost; a write to B flips it."""
    db = f"sqlite:///{tmp_path / 'shared.db'}" if backend == "sqlite" else request.getfixturevalue("postgres_url")
    args = ("--db", db, "--feed-poll-interval", "0.1")
    with serving(tmp_path, *args) as a, serving(tmp_path, *args) as b:
        instance_id = new_id()
        body = {"id": instance_id, "ipAddresses": [GUEST], "metadata": {"id": instance_id}}
        assert admin(a, "POST", "/device-metadata", json=body).status_code == 200
        record = {"id": instance_id, "os_type": "any", "mode": "install", "parameters": {
            "pub": {"value": "p"}, "priv": {"value": "q", "visibility": "private"},
            "sec": {"value": "held-by-a", "visibility": "secret"},
        }}
        assert admin(a, "POST", "/device-os", json=record).json()["applied"] is True
        wait_for(lambda: served(b).status_code == 200, what="the other replica to follow the change feed")
        assert json.loads(served(a).content) == {"pub": ["p", "public"], "priv": ["q", "private"],
                                                 "sec": ["held-by-a", "secret"]}
        assert json.loads(served(b).content) == {"pub": ["p", "public"], "priv": ["q", "private"]}
        assert admin(a, "GET", f"/device-os/{instance_id}").json()["parameters"]["sec"]["secret_state"] == "held"
        assert admin(b, "GET", f"/device-os/{instance_id}").json()["parameters"]["sec"]["secret_state"] == "lost"
        record["parameters"]["sec"]["value"] = "held-by-b"
        assert admin(b, "POST", "/device-os", json=record).json()["applied"] is True
        wait_for(lambda: "sec" not in json.loads(served(a).content), what="the other replica to follow the change feed")
        assert json.loads(served(b).content)["sec"] == ["held-by-b", "secret"]
        assert admin(a, "GET", f"/device-os/{instance_id}").json()["parameters"]["sec"]["secret_state"] == "lost"
