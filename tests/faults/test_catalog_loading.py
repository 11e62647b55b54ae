"""Until the catalog is in memory the listener answers (JSON 503, Retry-After), never stays silent.

The database is frozen (SIGSTOP) before ``imds serve`` starts, so loading cannot finish
until the test thaws it: meanwhile instance paths answer 503 and ``/readyz`` reports the
loading phase; once thawed, the catalog loads in the background and the same paths answer.
"""

from __future__ import annotations

import pytest

from fault_tools import faulty_postgres
from helpers import wait_for
from postgres_server import in_thread
from serve_process import client_at, serving

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

GUEST = "127.0.0.22"


def test_the_listener_answers_503_while_the_catalog_loads(tmp_path):
    """Frozen store at startup: /metadata 503 JSON + Retry-After, /readyz 503 'waiting'/'reading'; thawed: ready."""
    from imds.store.sql import migrate  # noqa: PLC0415 - SQLAlchemy loads only for database tests

    with faulty_postgres() as pg:
        url = pg.database()
        in_thread(lambda: migrate.upgrade(url))
        pg.freeze()
        with serving(tmp_path, "--db", url, "--no-migrate", "--db-connect-timeout", "1",
                     "--db-statement-timeout", "1", "--data-dir", str(tmp_path / "data"), loaded=False) as server:
            with client_at(GUEST) as guest:
                early = guest.get(f"{server.url}/metadata")
                assert early.status_code == 503
                assert early.headers["retry-after"] == "1"
                assert early.json() == {"message": "the instance catalog is still loading; see /readyz"}
                assert guest.get(f"{server.url}/openstack/latest/meta_data.json").status_code == 503
                assert guest.get(f"{server.url}/latest/meta-data/").status_code == 503
            with client_at() as probe:
                ready = probe.get(f"{server.url}/readyz", timeout=10.0)
                assert ready.status_code == 503
                assert ready.json()["loading"]["phase"] in {"waiting", "reading"}
                assert "instance index not loaded" in ready.json()["problems"]
                pg.thaw()
                wait_for(lambda: probe.get(f"{server.url}/readyz", timeout=10.0).status_code == 200,
                         what="readiness after the database was thawed", timeout=60)
                assert probe.get(f"{server.url}/readyz").json()["loading"] == {
                    "phase": "loaded", "indexed": 0, "total": 0}
            with client_at(GUEST) as guest:
                late = guest.get(f"{server.url}/metadata")
                assert late.status_code == 404  # loaded: an unknown caller, no longer "loading"
                assert late.json()["message"] == f"no instance is associated with {GUEST}"
            assert "catalog.load_failed" in server.output()
