"""PostgreSQL failover as operators run it: Patroni + etcd, synchronous replication, two imds replicas.

One cluster (tests/patroni_cluster.py) serves the module; each test starts two real ``imds
serve`` replicas on it, one with a multi-host URL (a different form per fault) and one with
the single haproxy endpoint that follows the leader, puts them under write and read load, and
breaks the primary: ``kill -9`` of Patroni and PostgreSQL, SIGSTOP of both (a hung machine),
or ``patronictl switchover``. Checked from the harness's own observations:

- no acknowledged write is lost (every one is on the new primary, as written);
- each replica's writes are back within 5 s of the new primary taking its first committed
  write (freeze: also within Patroni's TTL + 5 s of the freeze);
- from 1 s after writes are back on both, each replica serves a write made through the other
  within 1 s; the other writers pause then, so only the feed's NOTIFY can tell it (a write of
  its own would make a replica catch up, and the fallback poll is 30 s here);
- no instance read fails, no replica restarts, and both catalogs end equal to the database.

The figures per fault are printed (``FIGURES``) and recorded in docs/operations.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
import pytest

from helpers import wait_for
from patroni_cluster import DATABASE, TTL, Node, PatroniCluster, patroni_cluster
from patroni_probe import WriteProbe
from serve_process import ADMIN_TOKEN, Server, metric, serving

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(900)]

CONNECT_TIMEOUT = STATEMENT_TIMEOUT = 2.0
WRITERS = 2  # per replica (and a reader per replica and READ_SOURCES address)
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
READ_SOURCES = ("127.0.33.1", "127.0.33.2")  # one pre-written instance per source address
MARKER_SOURCE = "127.0.33.9"
WRITES_BACK = 5.0  # seconds from the new primary's first committed write to each replica's
# Seconds a write through one replica may take to be served by the other. A NOTIFY makes it well under one
# second; but a listener that loses its connection (no answer to its probe within 2 s on a loaded box, just after a
# promotion) rejoins after up to a probe timeout and a RETRY, then catches up. Still far under the replicas'
# 30 s --feed-poll-interval: a write learned only by polling is never in time.
FOLLOW = 5.0
READ_EVERY = 0.02  # seconds between two reads looking for a marker: the resolution of a follow time
SETTLE = 5.0  # seconds of marker writes alone once both replicas write again
# The writers pause for SETTLE; a server closing their idle keep-alive connection just as they
# resume (imds closes after --keepalive-timeout, 5 s by default, or --header-timeout) races the next POST, which
# httpx cannot retry: "Server disconnected without sending a response", no answer from imds at
# all. The replicas keep idle connections well past any pause here.
KEEPALIVE = 6 * SETTLE
START = 90.0  # seconds for a replica to start: imports alone took 12 s on a loaded 2-core machine
_addresses = itertools.count(1)


@dataclass
class Ack:
    """One acknowledged write: its instance, hostname, replica, and when it was sent and answered."""

    instance_id: str
    hostname: str
    replica: int
    started: float
    finished: float


@dataclass
class Marker:
    """A write through one replica, and when the other served it (None: not within the wait).

    ``quiet``: no other write went through either replica meanwhile, so the other replica
    could only learn of it from the feed's NOTIFY (its own writes would make it catch up).
    """

    replica: int
    acked: float
    seen: float | None
    quiet: bool


@dataclass
class Load:
    """Writers, readers and a marker pair over two replicas, every outcome recorded."""

    replicas: list[Server]
    acks: list[Ack] = field(default_factory=list)
    failed_writes: list[tuple[int, float, int, str]] = field(default_factory=list)  # replica, at, status, body
    reads: list[tuple[float, int, bool]] = field(default_factory=list)  # at, status, body right
    markers: list[Marker] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    writing: threading.Event = field(default_factory=threading.Event)  # cleared: the writers pause
    _in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def quiet(self) -> bool:
        """Whether the writers are paused and none of their writes is in flight."""
        with self._lock:
            return not self.writing.is_set() and self._in_flight == 0

    def start(self) -> None:
        self.writing.set()
        for index in range(len(self.replicas)):
            for _ in range(WRITERS):
                self._spawn(lambda i=index: self._write(i))
            for source in READ_SOURCES:
                self._spawn(lambda i=index, s=source: self._read(i, s))
        self._spawn(self._mark)

    def _spawn(self, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _write(self, index: int) -> None:
        url = self.replicas[index].url
        with httpx.Client(timeout=30.0, trust_env=False) as client:
            while not self._stop.is_set():
                with self._lock:
                    writing = self.writing.is_set()
                    self._in_flight += writing
                if not writing:
                    self.writing.wait(timeout=1.0)  # woken as soon as writing starts
                    continue
                try:
                    self._write_one(client, index, url)
                finally:
                    with self._lock:
                        self._in_flight -= 1

    def _write_one(self, client: httpx.Client, index: int, url: str) -> None:
        instance_id, hostname = str(uuid.uuid4()), f"w-{uuid.uuid4().hex[:10]}"
        n = next(_addresses)
        body = {"id": instance_id, "ipAddresses": [f"10.77.{n >> 8 & 255}.{n & 255}"],
                "metadata": {"id": instance_id, "hostname": hostname}}
        started = time.monotonic()
        try:
            answer = client.post(f"{url}/device-metadata", json=body, headers=AUTH)
            status, text = answer.status_code, answer.text
        except httpx.TransportError as exc:
            status, text = 0, repr(exc)
        if status == 200 and json.loads(text).get("applied") is True:
            self.acks.append(Ack(instance_id, hostname, index, started, time.monotonic()))
        else:
            self.failed_writes.append((index, started, status, text))
            self._stop.wait(0.05)  # pacing while the cluster fails over; ends at once on stop

    def _read(self, index: int, source: str) -> None:
        transport = httpx.HTTPTransport(local_address=source)
        with httpx.Client(transport=transport, timeout=30.0, trust_env=False) as client:
            while not self._stop.is_set():
                at = time.monotonic()
                try:
                    answer = client.get(f"{self.replicas[index].url}/metadata")
                    self.reads.append((at, answer.status_code, f'"r-{source}"' in answer.text))
                except httpx.TransportError:
                    self.reads.append((at, 0, False))
                self._stop.wait(0.01)  # a reader's pace (~100 reads/s), ends at once on stop

    def _mark(self) -> None:
        """Write through one replica, then watch the other serve it (alternating)."""
        instance_id = str(uuid.uuid4())
        with httpx.Client(timeout=30.0, trust_env=False) as admin, httpx.Client(
                transport=httpx.HTTPTransport(local_address=MARKER_SOURCE), timeout=5.0, trust_env=False) as guest:
            for n in itertools.count():
                if self._stop.is_set():
                    return
                writer, reader = n % 2, 1 - n % 2
                body = {"id": instance_id, "ipAddresses": [MARKER_SOURCE],
                        "metadata": {"id": instance_id, "hostname": f"m-{n}"}}
                try:
                    answer = admin.post(f"{self.replicas[writer].url}/device-metadata", json=body, headers=AUTH)
                except httpx.TransportError:
                    continue
                if answer.status_code != 200:
                    self._stop.wait(0.1)
                    continue
                acked = time.monotonic()
                quiet = self.quiet()
                seen = self._seen(guest, self.replicas[reader], f"m-{n}")
                self.markers.append(Marker(writer, acked, seen, quiet and self.quiet()))
                self._stop.wait(0.1)  # one marker per ~0.1 s, ends at once on stop

    def _seen(self, guest: httpx.Client, replica: Server, hostname: str) -> float | None:
        deadline = time.monotonic() + 2 * FOLLOW  # long enough to tell late from lost, short enough to go on
        while time.monotonic() < deadline:
            with_hostname = False
            with contextlib.suppress(httpx.TransportError):
                with_hostname = f'"{hostname}"' in guest.get(f"{replica.url}/metadata").text
            if with_hostname:
                return time.monotonic()
            time.sleep(READ_EVERY)
        return None

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)


@pytest.fixture(scope="module")
def cluster() -> Iterator[PatroniCluster]:
    with patroni_cluster() as started:
        yield started


@pytest.fixture(scope="module")
def probe(cluster: PatroniCluster) -> Iterator[WriteProbe]:
    writes = WriteProbe(cluster)
    try:
        yield writes
    finally:
        writes.stop()


@contextmanager
def replicas(tmp_path: Path, cluster: PatroniCluster, form: str) -> Iterator[list[Server]]:
    """Two replicas: the multi-host URL in ``form``, and the haproxy endpoint; readers' instances written."""
    args = ("--db-connect-timeout", str(CONNECT_TIMEOUT), "--db-statement-timeout", str(STATEMENT_TIMEOUT),
            "--feed-poll-interval", "30", "--keepalive-timeout", str(KEEPALIVE),
            "--header-timeout", str(KEEPALIVE), "--data-dir")
    with serving(tmp_path, "--db", cluster.dsn(form), *args, str(tmp_path / "a"), start_timeout=START) as a, \
            serving(tmp_path, "--db", cluster.dsn("proxy"), *args, str(tmp_path / "b"), start_timeout=START) as b:
        for source in READ_SOURCES:
            instance_id = str(uuid.uuid4())
            a.post("/device-metadata", {"id": instance_id, "ipAddresses": [source],
                                        "metadata": {"id": instance_id, "hostname": f"r-{source}"}})
        for server in (a, b):
            wait_for(lambda s=server: "feed.listening" in s.output(), what="the replica to listen", timeout=30)
        yield [a, b]


def _database_view(cluster: PatroniCluster, leader: Node, ids: list[str]) -> tuple[dict[str, str], int, int]:
    """On the leader: hostname by instance id (of ``ids``), the instance count, the feed head."""

    async def read() -> tuple[dict[str, str], int, int]:
        conn = await asyncpg.connect(cluster.url(leader, DATABASE), timeout=10)
        try:
            rows = await conn.fetch("SELECT instance_id, document FROM instance_metadata WHERE instance_id = ANY($1)",
                                    ids)
            count = await conn.fetchval("SELECT count(*) FROM instances")
            head = await conn.fetchval("SELECT seq FROM feed_head WHERE id = 1")
        finally:
            await conn.close()
        found = {row["instance_id"]: json.loads(row["document"])["hostname"] for row in rows}
        return found, int(count), int(head)

    return asyncio.run(read())


def _break(cluster: PatroniCluster, fault: str, leader: Node) -> None:
    standby = cluster.other(leader)
    if fault == "kill":
        cluster.kill(leader)
    elif fault == "freeze":
        cluster.freeze(leader)
    else:
        cluster.switchover(leader, standby)


def _repair(cluster: PatroniCluster, fault: str, old: Node) -> None:
    if fault == "kill":
        cluster.start_node(old)  # it rejoins as a standby (pg_rewind)
    elif fault == "freeze":
        cluster.thaw(old)  # it wakes up, finds its lock gone, demotes and follows


@pytest.mark.parametrize(("fault", "form"), [("kill", "netloc"), ("freeze", "query"), ("switchover", "repeated")])
def test_failover_under_load(cluster: PatroniCluster, probe: WriteProbe, tmp_path: Path, fault: str,
                             form: str) -> None:
    """The primary killed, frozen or switched over under load: no acknowledged write lost, writes and feed back."""
    old = cluster.wait_healthy()
    new = cluster.other(old)
    with replicas(tmp_path, cluster, form) as servers:
        pids = [server.process.pid for server in servers]
        load = Load(servers)
        load.start()
        try:
            wait_for(lambda: {a.replica for a in load.acks} == {0, 1} and len(load.markers) >= 4,
                     what="writes through both replicas", timeout=60)
            broken = probe.reset()
            _break(cluster, fault, old)
            wait_for(lambda: new.name in probe.first, what=f"{new.name} to take a committed write", timeout=120,
                     explain=cluster.explain)
            writable = probe.first[new.name]
            back = [wait_for(lambda i=i: min((a.finished for a in load.acks if a.replica == i and
                                              a.finished >= writable), default=None),
                             what=f"writes through replica {i}", timeout=60) for i in (0, 1)]
            # Both write again: now only the markers write, so a replica learns of the other's
            # writes from the feed alone (a write of its own would make it catch up anyway).
            load.writing.clear()
            time.sleep(SETTLE)
            load.writing.set()
            _repair(cluster, fault, old)
            cluster.wait_healthy()
            time.sleep(1.0)  # the load goes on through the old primary's return as a standby
        finally:
            load.stop()
        figures = _check(cluster, load, servers, pids, fault=fault, broken=broken, writable=writable, back=back)
    print(f"\nFIGURES {fault} ({form} + proxy): {json.dumps(figures)}")  # noqa: T201 - the figures for docs


def _feed_lines(servers: list[Server]) -> list[list[str]]:
    """Each replica's last feed and store log lines (where its listener was, when it lost and rejoined it)."""
    return [[line for line in server.output().splitlines() if '"feed.' in line or '"store.' in line][-15:]
            for server in servers]


def _check(cluster: PatroniCluster, load: Load, servers: list[Server], pids: list[int], *, fault: str,
           broken: float, writable: float, back: list[float]) -> dict[str, object]:
    # No replica restarted.
    assert [s.process.pid for s in servers] == pids
    assert all(s.process.poll() is None for s in servers), [s.output()[-2000:] for s in servers]
    # Writes back in time.
    for i, at in enumerate(back):
        assert at - writable <= WRITES_BACK, (i, at - writable)
        if fault == "freeze":
            assert at - broken <= TTL + WRITES_BACK, (i, at - broken)
    # Failed writes were answered: a JSON 503, never a 500 or a hang.
    for replica, _at, status, body in load.failed_writes:
        assert status == 503, (replica, status, body[:300])
        assert json.loads(body)["message"], body
    # No instance read failed.
    assert load.reads, "no reads"
    bad_reads = [read for read in load.reads if read[1] != 200 or not read[2]]
    assert not bad_reads, bad_reads[:5]
    # The feed: from 1 s after both write again, each replica serves the other's write within FOLLOW.
    following = max(back) + 1.0
    judged = [m for m in load.markers if m.acked >= following and m.quiet]
    late = [m for m in judged if m.seen is None or m.seen - m.acked > FOLLOW]
    assert len({m.replica for m in judged}) == 2, f"too few marker writes after recovery: {judged}"
    assert not late, (late[:5], _feed_lines(servers))
    # No acknowledged write lost, and both catalogs hold what the database holds.
    leader = cluster.wait_healthy()
    written = {a.instance_id: a.hostname for a in load.acks}
    stored, count, head = _database_view(cluster, leader, list(written))
    lost = {i: h for i, h in written.items() if stored.get(i) != h}
    assert not lost, f"{len(lost)} of {len(written)} acknowledged writes lost"
    for server in servers:
        wait_for(lambda s=server: metric(s, "imds_catalog_feed_position") == head and
                 metric(s, "imds_catalog_instances") == count, what="the catalog to match the database", timeout=60)
    unavailable = [s.output().count('"store.unavailable"') for s in servers]
    if fault != "switchover":  # a switchover may pass without a failed attempt
        assert all(unavailable), "a replica never logged store.unavailable"
        for server, reached in zip(servers, (leader.address, f"127.0.0.1:{cluster.proxy_port}"), strict=True):
            assert reached in _logged(server, "store.recovered"), (reached, server.output()[-3000:])
    lags = [m.seen - m.acked for m in judged if m.seen is not None]
    return {
        "failover_s": round(writable - broken, 2),
        "writes_back_s": [round(at - writable, 2) for at in back],
        "acked": len(written), "lost": len(lost), "failed_writes": len(load.failed_writes),
        "reads": len(load.reads), "failed_reads": 0,
        "feed_lag_max_s": round(max(lags), 3), "markers_judged": len(judged),
        "unavailable_lines": unavailable,
    }


def _logged(server: Server, event: str) -> list[str]:
    """The ``server`` field of each ``event`` line in the replica's JSON log."""
    lines = (json.loads(line) for line in server.output().splitlines() if line.startswith("{"))
    return [str(entry.get("server")) for entry in lines if entry.get("event") == event]
