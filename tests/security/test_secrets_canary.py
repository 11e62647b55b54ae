"""The canary: unique secret and private values, every endpoint and error path, then a search of everything.

A real ``imds serve --log-level debug`` process takes an OS record whose secret and
private parameters (and package credentials) are fresh random canaries, then every
admin route, every /ganeti path, the other flavors, invalid writes carrying the canaries,
a write that fails inside the database (its table renamed away under the running
service) and a package fetch that fails. Then the SQLite file with its -wal and -shm
(or a pg_dump), every log line, every admin response and /metrics are searched:

- the secret (and the package credentials) appear only in the instance's own
  parameters.json (the credentials only on the wire to the package server);
- the private value appears only there and in the database, and not in the database in
  clear when ``--private-key-file`` is given.

After a restart the secret is gone, and the admin read says ``lost``.
"""

from __future__ import annotations

import base64
import json
import secrets
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.fernet import Fernet

from factories import new_id
from fake_upstream import FakeUpstream, running_upstream
from helpers import LOOPBACK_FETCH_ARGS
from postgres_server import PostgresServer, find_binaries
from serve_process import Server, client_at, serving

EXAMPLES = Path(__file__).parents[2] / "examples" / "ganeti-os"
PARAMS = "/ganeti/latest/os/parameters.json"


@dataclass
class Canaries:
    """Fresh values for one run; ``forbidden`` are the ones no log, admin answer or metric may hold."""

    secret: str = field(default_factory=lambda: f"canarysecret{secrets.token_hex(12)}")
    install_secret: str = field(default_factory=lambda: f"canaryinstallsecret{secrets.token_hex(12)}")
    private: str = field(default_factory=lambda: f"canaryprivate{secrets.token_hex(12)}")
    user: str = field(default_factory=lambda: f"canaryuser{secrets.token_hex(8)}")
    password: str = field(default_factory=lambda: f"canarypass{secrets.token_hex(8)}")

    def secrets(self) -> dict[str, bytes]:
        """Every memory-only value, in every form it could leak in."""
        basic = base64.b64encode(f"{self.user}:{self.password}".encode())
        return {
            "secret": self.secret.encode(), "install secret": self.install_secret.encode(),
            "package user": self.user.encode(), "package password": self.password.encode(), "basic auth": basic,
        }

    def all(self) -> dict[str, bytes]:
        return {**self.secrets(), "private": self.private.encode()}


def os_record(instance_id: str, c: Canaries, package_url: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": instance_id, "os_type": "tiny", "mode": "install", "communication": True,
        "parameters": {
            "hostname": {"value": "canary-host", "visibility": "public"},
            "root-hash": {"value": c.private, "visibility": "private"},
            "root-password": {"value": c.secret, "visibility": "secret"},
        },
        "install_parameters": {"disk": {"value": c.install_secret, "visibility": "secret"}},
        "package": {"url": package_url, "username": c.user, "password": c.password},
        **extra,
    }


class Recorder:
    """Every admin/ops answer (status line, headers, body) and every instance answer, kept apart."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.admin: list[bytes] = []
        self.instance: dict[str, list[bytes]] = {}
        self._admin = httpx.Client(base_url=server.url, headers=server.admin_headers, timeout=10.0, trust_env=False)

    def close(self) -> None:
        self._admin.close()

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        answer = self._admin.request(method, path, **kwargs)
        self.admin.append(_dump(answer))
        return answer

    def guest(self, ip: str, path: str, method: str = "GET", **kwargs: Any) -> httpx.Response:
        with client_at(ip) as client:
            answer = client.request(method, f"{self.server.url}{path}", **kwargs)
        self.instance.setdefault(path, []).append(_dump(answer))
        return answer


def _dump(answer: httpx.Response) -> bytes:
    headers = "\n".join(f"{k}: {v}" for k, v in answer.headers.items())
    return f"{answer.status_code}\n{headers}\n".encode() + answer.content


def exercise(rec: Recorder, c: Canaries, upstream: FakeUpstream, ip: str, other_ip: str, *,
             rename_table: Callable[[str, str], None]) -> str:
    """Every route and error path with the canaries; returns the instance id."""
    instance_id = new_id()
    package = f"{upstream.base}/pkg/canary.tar.gz"
    for target, who in ((instance_id, ip), (new_id(), other_ip)):
        body = {"id": target, "ipAddresses": [who], "metadata": {"id": target, "hostname": "h"}}
        assert rec.call("POST", "/device-metadata", json=body).status_code == 200
    good = os_record(instance_id, c, package)
    # Error paths first, each carrying the canaries: nothing may be stored, echoed or logged.
    bad_bodies: list[Any] = [
        {**good, "mode": "reinstall"},
        {**good, "surprise": c.secret},
        {**good, "parameters": {**good["parameters"], "Bad Name": {"value": c.secret, "visibility": "secret"}}},
        {**good, "parameters": {"long": {"value": c.secret * 400, "visibility": "secret"}}},
        {**good, "parameters": {"x": {"value": c.private, "visibility": "hidden"}}},
        {**good, "package": {"url": f"http://{c.user}:{c.password}@192.0.2.1/p.tgz"}},
        {**good, "package": {"url": "http://192.0.2.1/p.zip", "username": c.user, "password": c.password}},
        {**good, "os_type": "not-loaded"},
        {**good, "id": new_id()},  # no such instance: 404
        {**good, "id": c.secret},
    ]
    for body in bad_bodies:
        answer = rec.call("POST", "/device-os", json=body)
        assert answer.status_code in {400, 404}, answer.text
    truncated = json.dumps(good)[:-40].encode()
    assert rec.call("POST", "/device-os", content=truncated).status_code == 400
    assert rec.call("POST", "/device-os", content=b"x" * (1024 * 1024 + 1) + c.secret.encode()).status_code == 413
    # A write that fails inside the database (a foreign exception, translated to 503).
    rename_table("instance_os", "instance_os_gone")
    try:
        failed = rec.call("POST", "/device-os", json=good)
        assert failed.status_code == 503, failed.text
    finally:
        rename_table("instance_os_gone", "instance_os")
    # The real write, a stale one carrying other values, then every read.
    assert rec.call("POST", "/device-os", json={**good, "updated_at": "2026-11-23T12:00:00Z"}).json()["applied"]
    stale = rec.call("POST", "/device-os", json={**good, "updated_at": "2026-11-23T11:00:00Z"})
    assert stale.json()["applied"] is False
    shown = rec.call("GET", f"/device-os/{instance_id}").json()
    assert shown["parameters"]["root-password"] == {"visibility": "secret", "secret_state": "held"}
    assert shown["parameters"]["root-hash"] == {"visibility": "private", "value": "<private>"}
    rec.call("HEAD", f"/device-os/{instance_id}")
    rec.call("GET", f"/api/v1/device-os/{instance_id}")
    for path in ("/os-definitions", "/os-definitions/tiny", f"/device-metadata/{instance_id}", "/healthz",
                 "/readyz", "/openapi.json", "/metrics"):
        rec.call("GET", path)
    # The instance side.
    served = json.loads(rec.guest(ip, PARAMS).content)
    assert served["root-password"] == [c.secret, "secret"]
    assert served["disk"] == [c.install_secret, "secret"]
    assert served["root-hash"] == [c.private, "private"]
    upstream.answer("/pkg/canary.tar.gz", 200, _tiny_archive(), content_type="application/gzip")
    assert rec.guest(ip, "/ganeti/latest/os/package").status_code == 200
    assert upstream.log("/pkg/")[-1].basic_auth() == (c.user, c.password)
    upstream.answer("/pkg/canary.tar.gz", 401, b"")
    assert rec.guest(ip, "/ganeti/latest/os/package").status_code == 502
    for path in ("/ganeti", "/ganeti/latest", "/ganeti/latest/os", "/ganeti/latest/os/scripts/create",
                 "/ganeti/latest/os/os-install-package", "/ganeti/latest/read", "/metadata", "/userdata",
                 "/latest/meta-data/", "/openstack/latest/meta_data.json", "/nocloud/meta-data"):
        rec.guest(ip, path)
    rec.guest(ip, "/ganeti/latest/write", method="POST", content=c.secret.encode())
    rec.guest(ip, PARAMS, method="POST", content=c.secret.encode())
    assert rec.guest(other_ip, PARAMS).status_code == 404
    exercise_channel(rec, c, instance_id, ip)
    rec.call("GET", "/metrics")
    return instance_id


def exercise_channel(rec: Recorder, c: Canaries, instance_id: str, ip: str) -> None:
    """The channel and change watch while the record holds the canaries: events, messages, SSE, audit."""
    for path in ("/events", "/ganeti/latest/write"):
        assert rec.guest(ip, path, method="POST", json={"state": "running", "message": "step"}).status_code == 200
        bad = rec.guest(ip, path, method="POST", json={"state": f"{c.secret} {c.private}", "message": c.secret})
        assert bad.status_code == 400, bad.text
        big = rec.guest(ip, path, method="POST", content=c.secret.encode() * 1000)
        assert big.status_code == 413, big.text
    assert rec.guest(ip, "/phone-home", method="POST", json={"state": "booted"}).status_code == 200
    assert rec.call("POST", f"/device-messages/{instance_id}", content=b"proceed").status_code == 200
    assert rec.guest(ip, "/ganeti/latest/read").content == b"proceed"
    assert rec.guest(ip, "/ganeti/latest/read").status_code == 404
    events = rec.call("GET", f"/device-events/{instance_id}", params={"after": 0}).json()["events"]
    assert [e["state"] for e in events][:2] == ["running", "running"]
    with httpx.Client(base_url=rec.server.url, headers=rec.server.admin_headers, timeout=10.0,
                      trust_env=False) as client, \
            client.stream("GET", f"/device-events/{instance_id}/stream", params={"after": 0}) as stream:
        first = b""
        for chunk in stream.iter_bytes():
            first += chunk
            if b"\n\n" in first:
                break
        rec.admin.append(first)
    assert b"running" in first
    # Change watch on every flavor, the Ganeti parameters included (held to its timeout: nothing changes).
    for path in ("/metadata", "/latest/meta-data/", "/openstack/latest/meta_data.json", PARAMS):
        answer = rec.guest(ip, path)
        etag = answer.headers["etag"]
        held = rec.guest(ip, path, params={"wait_for_change": "true", "last_etag": etag, "timeout_sec": "1"})
        assert held.status_code == 200, (path, held.text)
        assert held.headers["etag"] == etag
    rec.call("GET", "/audit")


def _tiny_archive() -> bytes:
    import io  # noqa: PLC0415
    import tarfile  # noqa: PLC0415

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        info = tarfile.TarInfo("motd")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    return raw.getvalue()


def assert_nowhere(where: str, data: bytes, values: dict[str, bytes]) -> None:
    for name, value in values.items():
        assert value not in data, f"the {name} canary leaked into {where}"


def check_run(rec: Recorder, c: Canaries) -> None:
    """Logs, admin answers and metrics hold no canary; instance answers hold them only in parameters.json."""
    assert_nowhere("the log", rec.server.output().encode(), c.all())
    for answer in rec.admin:
        assert_nowhere("an admin/ops answer", answer, c.all())
    for path, answers in rec.instance.items():
        if path != PARAMS:
            for answer in answers:
                assert_nowhere(f"the instance answer of {path}", answer, c.all())


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with running_upstream() as fake:
        yield fake


def loopback_pair() -> tuple[str, str]:
    base = f"127.{secrets.randbelow(200) + 20}.{secrets.randbelow(250) + 1}"
    return f"{base}.10", f"{base}.11"


def serve_args(db: str, key_file: Path | None) -> list[str]:
    args = ["--db", db, "--log-level", "debug", "--os-definitions-dir", str(EXAMPLES), "--feed-poll-interval", "0.2",
            *LOOPBACK_FETCH_ARGS]  # the fake package server is on loopback
    return [*args, "--private-key-file", str(key_file)] if key_file is not None else args


def key_file_for(tmp_path: Path, *, encrypted: bool) -> Path | None:
    if not encrypted:
        return None
    path = tmp_path / "private.keys"
    path.write_text(Fernet.generate_key().decode() + "\n")
    return path


def restart_and_check(tmp_path: Path, args: list[str], c: Canaries, instance_id: str, ip: str) -> None:
    """After a restart the secrets are reported lost and are not served; the private value still is."""
    with serving(tmp_path, *args) as server:
        rec = Recorder(server)
        try:
            shown = rec.call("GET", f"/device-os/{instance_id}").json()
            assert shown["parameters"]["root-password"] == {"visibility": "secret", "secret_state": "lost"}
            assert shown["install_parameters"]["disk"] == {"visibility": "secret", "secret_state": "lost"}
            assert shown["package"]["credentials_state"] == "lost"
            served = json.loads(rec.guest(ip, PARAMS).content)
            assert served == {"hostname": ["canary-host", "public"], "root-hash": [c.private, "private"]}
            assert rec.call("DELETE", f"/device-os/{instance_id}").json() == {"id": instance_id, "deleted": "os"}
            assert rec.call("GET", f"/device-os/{instance_id}").status_code == 404
            assert rec.guest(ip, PARAMS).status_code == 404
            check_run(rec, c)
            assert_nowhere("parameters.json after a restart", rec.instance[PARAMS][0], c.secrets())
        finally:
            rec.close()


@pytest.mark.parametrize("encrypted", [False, True], ids=["clear", "encrypted"])
def test_canary_sqlite(tmp_path: Path, upstream: FakeUpstream, encrypted: bool):
    """SQLite: the file, its WAL and shm, the debug log, admin answers and metrics hold no secret."""
    c = Canaries()
    db_path = tmp_path / "imds.db"
    args = serve_args(f"sqlite:///{db_path}", key_file_for(tmp_path, encrypted=encrypted))
    ip, other_ip = loopback_pair()

    def rename_table(old: str, new: str) -> None:
        with sqlite3.connect(db_path, timeout=30) as conn:
            conn.execute(f"ALTER TABLE {old} RENAME TO {new}")

    with serving(tmp_path, *args) as server:
        rec = Recorder(server)
        try:
            instance_id = exercise(rec, c, upstream, ip, other_ip, rename_table=rename_table)
            files = {p.name: p.read_bytes() for p in tmp_path.glob("imds.db*")}
            assert "imds.db" in files
            assert "imds.db-wal" in files  # WAL mode: the write went through the WAL first
            check_run(rec, c)
        finally:
            rec.close()
    files_after = {f"{p.name} (stopped)": p.read_bytes() for p in tmp_path.glob("imds.db*")}
    everything = b"".join([*files.values(), *files_after.values()])
    for name, data in {**files, **files_after}.items():
        assert_nowhere(name, data, c.secrets())
    if encrypted:
        assert c.private.encode() not in everything
        assert b"gAAAAA" in everything  # the Fernet token is what is stored
    else:
        assert c.private.encode() in everything  # stored (in clear without a key file)
    restart_and_check(tmp_path, args, c, instance_id, ip)


@pytest.mark.postgres
@pytest.mark.parametrize("encrypted", [False, True], ids=["clear", "encrypted"])
def test_canary_postgres(tmp_path: Path, upstream: FakeUpstream, postgres_server: PostgresServer,
                         postgres_url: str, encrypted: bool):
    """PostgreSQL: a pg_dump of the database, the debug log, admin answers and metrics hold no secret."""
    c = Canaries()
    args = serve_args(postgres_url, key_file_for(tmp_path, encrypted=encrypted))
    ip, other_ip = loopback_pair()
    database = postgres_url.rsplit("/", 1)[1]

    def psql(statement: str) -> None:
        done = subprocess.run(
            [str(find_binaries() / "psql"), "-h", postgres_server.host, "-p", str(postgres_server.port),
             "-U", postgres_server.superuser, "-d", database, "-v", "ON_ERROR_STOP=1", "-c", statement],
            capture_output=True, text=True, timeout=30, check=False,
        )
        assert done.returncode == 0, done.stderr

    def rename_table(old: str, new: str) -> None:
        psql(f"ALTER TABLE {old} RENAME TO {new}")

    with serving(tmp_path, *args) as server:
        rec = Recorder(server)
        try:
            instance_id = exercise(rec, c, upstream, ip, other_ip, rename_table=rename_table)
            check_run(rec, c)
        finally:
            rec.close()
    dump = subprocess.run(
        [str(find_binaries() / "pg_dump"), "-h", postgres_server.host, "-p", str(postgres_server.port),
         "-U", postgres_server.superuser, database],
        capture_output=True, timeout=60, check=False,
    )
    assert dump.returncode == 0, dump.stderr
    assert b"instance_os" in dump.stdout
    assert_nowhere("the pg_dump", dump.stdout, c.secrets())
    if encrypted:
        assert c.private.encode() not in dump.stdout
        assert b"gAAAAA" in dump.stdout
    else:
        assert c.private.encode() in dump.stdout
    restart_and_check(tmp_path, args, c, instance_id, ip)
