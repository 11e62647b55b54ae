"""One address, one instance: catch-all prefixes refused, spellings of one network one address, moves never silent.

- A prefix wider than /8 (IPv4) or /16 (IPv6), ``0.0.0.0/0`` and ``::/0`` above all, would
  make its instance answer every caller no longer prefix claims: refused (admin API, import,
  Luxi) unless ``--allow-wide-prefixes``, and then every such write warns.
- ``10.70.17.9/31`` and ``10.70.17.8/31`` are one network: on SQLite both spellings stayed,
  each instance holding "its" network; now the later write takes it (revision 0008), and a
  database that still holds such a pair says so when it is loaded.
- An address taken from another instance (last write wins) is said: in the admin answer's
  warnings, in ``imds import``'s warnings, in the Luxi server's log.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from factories import new_id, next_ipv4
from helpers import admin_client, client_from, make_settings, running_app
from imds.metad.luxi import serving
from imds.store.sql import migrate
from luxi_client import instance, update
from postgres_server import in_thread
from serve_process import IMDS, clean_env

pytestmark = pytest.mark.anyio
WIDE = ["0.0.0.0/0", "::/0", "10.0.0.0/7", "2001::/15", "::ffff:0.0.0.0/96"]


def body(instance_id: str, *addresses: str) -> dict[str, object]:
    return {"id": instance_id, "ipAddresses": list(addresses), "metadata": {"hostname": instance_id[:8]}}


@pytest.mark.parametrize("wide", WIDE)
async def test_a_wide_prefix_is_refused_by_the_admin_api(wide):
    """400 naming the entry and the flag; nothing is written; an unknown caller stays unknown."""
    async with running_app() as app, admin_client(app) as admin:
        instance_id = new_id()
        answer = await admin.post("/device-metadata", json=body(instance_id, next_ipv4(), wide))
        assert answer.status_code == 400
        (problem,) = answer.json()["errors"]
        assert problem["field"] == "ipAddresses[1]"
        assert "--allow-wide-prefixes" in problem["message"]
        assert (await admin.get(f"/device-metadata/{instance_id}")).status_code == 404
        async with client_from(app, "198.51.100.200") as stranger:
            assert (await stranger.get("/metadata")).status_code == 404


async def test_with_the_flag_a_wide_prefix_is_taken_with_a_warning():
    """--allow-wide-prefixes: the catch-all instance answers strangers, and its write says so."""
    async with running_app(make_settings(allow_wide_prefixes=True)) as app, admin_client(app) as admin:
        instance_id = new_id()
        with capture_logs() as logs:
            answer = await admin.post("/device-metadata", json=body(instance_id, "0.0.0.0/0"))
        assert answer.status_code == 200, answer.text
        assert any("0.0.0.0/0 is a /0 (every address)" in w for w in answer.json()["warnings"])
        assert [log["addresses"] for log in logs if log["event"] == "record.wide_prefix"] == [["0.0.0.0/0"]]
        async with client_from(app, "198.51.100.200") as stranger:
            assert (await stranger.get("/metadata")).json()["hostname"] == instance_id[:8]


async def test_a_move_is_said_in_the_answer(sqlite_url):
    """An address taken from another instance: ``moved`` and a warning naming the previous holder."""
    async with running_app(make_settings(db=sqlite_url)) as app, admin_client(app) as admin:
        a, b, ip = new_id(), new_id(), next_ipv4()
        assert (await admin.post("/device-metadata", json=body(a, ip))).status_code == 200
        answer = (await admin.post("/device-metadata", json=body(b, ip))).json()
    assert answer["moved"] == {ip: a}
    assert answer["warnings"] == [(f"ipAddresses: {ip} moved here from instance {a} (an address has one holder: "
                                   "the last write wins)")]


@pytest.mark.parametrize(("first", "second"), [("10.70.17.9/31", "10.70.17.8/31"), ("10.70.17.8/31", "10.70.17.9/31"),
                                               ("2604:1380:4641:1f00::9/127", "2604:1380:4641:1f00::8/127")])
async def test_two_spellings_of_one_network_are_one_address(sqlite_url, first, second):
    """The later spelling takes the network from the earlier holder: one caller, one instance (SQLite kept both)."""
    async with running_app(make_settings(db=sqlite_url)) as app, admin_client(app) as admin:
        a, b = new_id(), new_id()
        assert (await admin.post("/device-metadata", json=body(a, first))).status_code == 200
        answer = (await admin.post("/device-metadata", json=body(b, second))).json()
        assert list(answer["moved"].values()) == [a]
        records = [(await admin.get(f"/device-records/{i}")).json()["ipAddresses"] for i in (a, b)]
    assert records == [[], [second]]
    async with running_app(make_settings(db=sqlite_url)) as again:  # a fresh load serves the same holder
        caller = first.split("/")[0]
        async with client_from(again, caller) as guest:
            assert (await guest.get("/metadata")).json()["hostname"] == b[:8]


async def test_a_database_holding_one_network_twice_says_so_when_loaded(tmp_path):
    """Rows left by an older revision that share a network: the load logs each pair (catalog.address_shared)."""
    path = tmp_path / "imds.db"
    url = f"sqlite:///{path}"
    in_thread(lambda: migrate.upgrade(url))  # Alembic runs its own event loop
    a, b = new_id(), new_id()
    async with running_app(make_settings(db=url)) as app, admin_client(app) as admin:
        assert (await admin.post("/device-metadata", json=body(a, "10.70.17.9/31"))).status_code == 200
        assert (await admin.post("/device-metadata", json=body(b, "10.60.0.1"))).status_code == 200
    with sqlite3.connect(path) as conn:  # what an older revision could leave: another spelling, another holder
        conn.execute("INSERT INTO instance_ip_addresses (address, instance_id, created_at) "
                     "VALUES ('10.70.17.8/31', ?, CURRENT_TIMESTAMP)", (b,))
    conn.close()
    with capture_logs() as logs:
        async with running_app(make_settings(db=url)):
            pass
    shared = [log for log in logs if log["event"] == "catalog.address_shared"]
    assert len(shared) == 1
    assert shared[0]["address"] == "10.70.17.8/31"
    assert {shared[0]["kept_by"], shared[0]["also_held_by"]} == {a, b}


def test_revision_0007_fills_the_network_of_every_address(tmp_path):
    """Upgrading from 0006 gives each stored address row its network (spelled ones their covering network)."""
    path = tmp_path / "imds.db"
    url = f"sqlite:///{path}"
    migrate.upgrade(url, "0006")
    rows = [("10.0.0.5/32", "10.0.0.5/32"), ("10.70.17.9/31", "10.70.17.8/31"),
            ("2604:1380:4641:1f00::9/127", "2604:1380:4641:1f00::8/127"), ("10.1.0.0/16", "10.1.0.0/16")]
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO instances (id, created_at) VALUES ('i-1', CURRENT_TIMESTAMP)")
        conn.executemany("INSERT INTO instance_ip_addresses (address, instance_id, created_at) "
                         "VALUES (?, 'i-1', CURRENT_TIMESTAMP)", [(address,) for address, _ in rows])
    conn.close()
    migrate.upgrade(url)
    with sqlite3.connect(path) as conn:
        found = dict(conn.execute("SELECT address, network FROM instance_ip_addresses").fetchall())
    conn.close()
    assert found == dict(rows)


def _imds(*args: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="imds-shared-") as home:
        return subprocess.run([str(IMDS), *args, "--log-level", "warning"], env=clean_env(Path(home)),
                              capture_output=True, text=True, timeout=300, check=False)


def test_import_refuses_a_wide_prefix_and_says_each_move(tmp_path, sqlite_url):
    """The import rejects a catch-all item (the flag takes it, with a warning) and warns of an address given twice."""
    ids = [str(uuid.UUID(int=n + 1, version=4)) for n in range(3)]
    items = [body(ids[0], "10.61.0.1"), body(ids[1], "10.61.0.1"), body(ids[2], "::/0")]
    source = tmp_path / "fleet.jsonl"
    source.write_text("".join(json.dumps(item) + "\n" for item in items))
    done = _imds("import", str(source), "--db", sqlite_url)
    assert done.returncode == 1
    assert done.stdout.startswith("2 created, 0 updated, 0 unchanged, 0 stale, 1 rejected")
    assert f"rejected line 3 ({ids[2]}): ipAddresses[0]: ::/0 is a /0 (every address)" in done.stdout
    assert (f"warning: line 2 ({ids[1]}): ipAddresses: 10.61.0.1 moved here from instance {ids[0]}"
            in done.stderr)
    allowed = _imds("import", str(source), "--db", sqlite_url, "--allow-wide-prefixes")
    assert allowed.returncode == 0, allowed.stdout
    assert "ipAddresses: ::/0 is a /0 (every address)" in allowed.stderr


async def test_luxi_refuses_a_catch_all_address_and_logs_a_move(tmp_path):
    """A push whose communication address is a catch-all is refused; one that takes another's address is logged."""
    path = tmp_path / "metad.sock"
    async with running_app(make_settings(ganeti_metad_socket=path)) as app, serving(app.services):
        refused = await update(path, instance(ip="0.0.0.0/0"))
        assert refused["success"] is False
        assert "ipAddresses[0]" in refused["result"][1][0]
        assert len(app.services.catalog) == 0
        first, second = instance(ip="192.0.2.77"), instance(ip="192.0.2.77")
        assert (await update(path, first))["success"] is True
        with capture_logs() as logs:
            assert (await update(path, second))["success"] is True
    moved = [log for log in logs if log["event"] == "metad.address_moved"]
    assert [log["moved"] for log in moved] == [{"192.0.2.77": first["uuid"]}]
