"""PostgreSQL stopped, restarted and frozen under read and write load, against a real ``imds serve``.

Reads keep answering 200 from memory throughout. While the database is away, writes and
``/readyz`` answer a JSON 503 that says so, within the configured timeouts (never a
plain-text 500, never a hang); after it is back, writes and readiness recover by themselves.
"""

from __future__ import annotations

import time

import httpx
import pytest

from fault_tools import Answer, FaultyPostgres, Load, faulty_postgres
from helpers import wait_for
from imds.store.sql.store import PING_WAIT
from serve_process import ADMIN_TOKEN, Server, serving

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

CONNECT_TIMEOUT, STATEMENT_TIMEOUT = 2.0, 2.0
# A write may wait for a pooled connection's ping, a reconnect and one statement: each bounded.
BOUND = CONNECT_TIMEOUT + 2 * STATEMENT_TIMEOUT + 2.0
READER = "127.0.0.21"
INSTANCE = "5b0c4a38-6a3e-4c4e-9f51-2f0a7a000001"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _write_body(n: int) -> dict[str, object]:
    return {"id": INSTANCE, "ipAddresses": [READER], "metadata": {"id": INSTANCE, "hostname": f"w-{n}"}}


def _start_load(server: Server) -> Load:
    load = Load()
    counter = iter(range(1_000_000))
    source = httpx.HTTPTransport(local_address=READER)

    def read(client: httpx.Client) -> httpx.Response:
        del client
        with httpx.Client(transport=source, timeout=30.0, trust_env=False) as reader:
            return reader.get(f"{server.url}/metadata")

    load.run("read", read)
    load.run("write", lambda c: c.post(f"{server.url}/device-metadata", json=_write_body(next(counter)),
                                       headers=AUTH))
    load.run("ready", lambda c: c.get(f"{server.url}/readyz"))
    return load


def _assert_outage_answers(answers: list[Answer], what: str) -> float:
    """Every answer during the outage: a JSON 503 naming the database, within BOUND; returns the longest."""
    assert answers, f"no {what} during the outage"
    for answer in answers:
        assert answer.status in {503, 200}, (what, answer)
        assert answer.seconds < BOUND, (what, answer)
    failed = [a for a in answers if a.status == 503]
    assert failed, f"every {what} succeeded while the database was away"
    for answer in failed:
        assert answer.body.startswith("{"), answer.body  # JSON, not a plain-text 500
    return max(a.seconds for a in answers)


def _outage(pg: FaultyPostgres, server: Server, begin: object, end: object, hold: float) -> dict[str, float]:
    """Run the load, break the database with ``begin``, hold, repair with ``end``; check every answer."""
    server.post("/device-metadata", _write_body(-1))
    load = _start_load(server)
    try:
        wait_for(lambda: any(a.status == 200 for a in load.answers["write"]), what="a first write", timeout=30)
        broken = time.monotonic()
        begin()  # type: ignore[operator]
        wait_for(lambda: any(a.status == 503 for a in load.since("write", broken)),
                 what="a write 503", timeout=BOUND + 5)
        wait_for(lambda: any(a.status == 503 for a in load.since("ready", broken)),
                 what="a /readyz 503", timeout=BOUND + 5)
        time.sleep(hold)  # keep the database away for a while under load (the outage itself, not a wait for a result)
        repaired = time.monotonic()
        end()  # type: ignore[operator]
        waited = time.monotonic()
        wait_for(lambda: any(a.status == 200 for a in load.since("write", repaired + BOUND)),
                 what="writes after the database came back", timeout=60)
        recovered = time.monotonic() - waited
        wait_for(lambda: any(a.status == 200 for a in load.since("ready", repaired + BOUND)),
                 what="readiness back", timeout=30)
    finally:
        load.stop()
    during = [a for a in load.answers["write"] if broken + 0.5 <= a.started and a.started + a.seconds <= repaired]
    ready = [a for a in load.answers["ready"] if broken + 0.5 <= a.started and a.started + a.seconds <= repaired]
    reads = [a for a in load.answers["read"] if broken <= a.started <= repaired]
    assert reads, "no reads during the outage"
    assert all(a.status == 200 and '"hostname"' in a.body for a in reads), [a for a in reads if a.status != 200][:3]
    longest = _assert_outage_answers(during, "write")
    ready_longest = _assert_outage_answers(ready, "readiness")
    # /readyz waits for the database at most PING_WAIT (a ping outstanding longer is reported, and shared):
    # answered well within its own probe timeout, whatever the database does (the slack is the loaded machine's).
    assert ready_longest < PING_WAIT + 1.0, ready_longest
    errors = {a.body for a in during if a.status == 503}
    assert all("database" in body for body in errors), errors
    return {"longest": longest, "ready_longest": ready_longest, "reads": len(reads), "writes_503": len(during),
            "recovered": recovered}


@pytest.fixture
def pg_serve(tmp_path):
    with faulty_postgres() as pg:
        url = pg.database()
        with serving(tmp_path, "--db", url, "--db-connect-timeout", str(CONNECT_TIMEOUT),
                     "--db-statement-timeout", str(STATEMENT_TIMEOUT), "--data-dir", str(tmp_path / "data")) as server:
            yield pg, server


def test_postgres_stopped_then_restarted_under_load(pg_serve):
    """Stop: reads 200 from memory, writes and /readyz a JSON 503 within the bound; restart: both recover."""
    pg, server = pg_serve
    figures = _outage(pg, server, pg.halt, pg.restart, hold=3.0)
    print(f"\nFIGURES postgres-stopped: {figures}")  # noqa: T201 - the suite's figures for the report


def test_postgres_frozen_then_thawed_under_load(pg_serve):
    """SIGSTOP on every postgres process: nothing hangs past the timeouts; SIGCONT: writes and readiness recover."""
    pg, server = pg_serve
    figures = _outage(pg, server, pg.freeze, pg.thaw, hold=3.0)
    print(f"\nFIGURES postgres-frozen: {figures}")  # noqa: T201 - the suite's figures for the report
