"""A real PostgreSQL HA stack for tests: etcd, two Patroni nodes in synchronous mode, haproxy on the leader.

Debian's ``etcd-server`` (3.4) and ``patroni`` (3.0.2) manage two PostgreSQL 15 nodes the way
production runs them, all started by the test in one temporary directory with free loopback
ports, and stopped by PID:

- etcd with its v2 API (``--enable-v2``): Patroni 3.0.2's ``etcd3`` driver overwrites the
  leader key when a frozen leader wakes up (an unconditional put with a new lease; fixed in
  Patroni 3.0.3, patroni#2689), so a thawed old primary took the leadership back from the
  promoted standby; its ``etcd`` (v2) driver compares and swaps;
- Patroni with a short TTL (``TTL`` s, ``loop_wait`` 2 s) and ``synchronous_mode``: a commit
  returns once the standby has the WAL, so a failover loses no acknowledged write;
- haproxy in front, checking each node's Patroni REST API ``/primary`` (``option httpchk``)
  and cutting sessions to a node it marks down: one endpoint that follows the leader.

Patroni, etcd and PostgreSQL run as the ``postgres`` account when the tests run as root
(PostgreSQL refuses root): set as the child's uid with ``subprocess.Popen(user=...)`` rather
than through ``runuser``, so the PID the test holds is Patroni's own (``kill -9`` and SIGSTOP
reach it, and runuser does not stop itself when its child is stopped). Patroni starts the
postmaster detached; its PID comes from ``postmaster.pid``. Faults: ``kill`` (SIGKILL of
Patroni and every PostgreSQL process of the node), ``freeze``/``thaw`` (SIGSTOP/SIGCONT of the
same), ``switchover`` (``patronictl``). ``patroni_probe.WriteProbe`` records when each node
first takes a real committed write, the moment a new primary is writable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
import pytest

from fault_tools import _children
from helpers import wait_for
from postgres_server import _postmaster_pid, _tail, find_binaries
from serve_process import free_port

TTL, LOOP_WAIT, RETRY_TIMEOUT = 10, 2, 4  # Patroni's leader lease and loop (TTL >= loop_wait + 2 * retry_timeout)
START_TIMEOUT = 120.0  # seconds for the cluster to come up on a loaded 2-core machine
STOP_TIMEOUT = 30.0
DATABASE = "imds"
SUPERUSER = "postgres"


def _account() -> pwd.struct_passwd | None:
    """The ``postgres`` account to run the stack as (None when not root: run as ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SUPERUSER)
    except KeyError:
        pytest.fail("running as root but there is no 'postgres' account to run PostgreSQL as", pytrace=False)


def _program(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed (Debian packages: patroni, etcd-server, haproxy)", pytrace=False)
    return found


@dataclass
class Node:
    """One Patroni-managed PostgreSQL node."""

    name: str
    pg_port: int
    api_port: int
    root: Path
    process: subprocess.Popen[bytes] | None = None
    frozen: list[int] = field(default_factory=list)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def config(self) -> Path:
        return self.root / "patroni.yml"

    @property
    def log(self) -> Path:
        return self.root / "patroni.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.pg_port}"

    def api(self, path: str) -> httpx.Response:
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            return client.get(f"http://127.0.0.1:{self.api_port}{path}")

    def is_leader(self) -> bool:
        """Whether Patroni's REST API says this node is the running primary (haproxy's check)."""
        with contextlib.suppress(httpx.HTTPError):
            return self.api("/primary").status_code == 200
        return False

    def processes(self) -> list[int]:
        """Patroni's PID and every PostgreSQL process of the node (postmaster first, then its children)."""
        found = [self.process.pid] if self.process is not None and self.process.poll() is None else []
        postmaster = _postmaster_pid(self.data)
        if postmaster is not None and Path(f"/proc/{postmaster[0]}").exists():
            found += [postmaster[0], *_children(postmaster[0])]
        return found


class PatroniCluster:
    """etcd + two Patroni nodes + haproxy, in ``root``; ``start``, faults, ``stop`` (all by PID)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = find_binaries()
        self.account = _account()
        self.scope = f"imds-{uuid.uuid4().hex[:8]}"
        self.etcd_port, self.etcd_peer = free_port(), free_port()
        self.proxy_port = free_port()
        self.nodes = [Node(f"node{i}", free_port(), free_port(), root / f"node{i}") for i in range(2)]
        self.etcd: subprocess.Popen[bytes] | None = None
        self.haproxy: subprocess.Popen[bytes] | None = None

    # --- what imds is given ---------------------------------------------------------------

    def dsn(self, form: str) -> str:
        """The database URL in one of the forms operators write: ``netloc``, ``query``, ``repeated``, ``proxy``."""
        a, b = self.nodes
        base = f"postgresql://{SUPERUSER}@"
        if form == "netloc":
            return f"{base}{a.address},{b.address}/{DATABASE}?target_session_attrs=read-write"
        if form == "query":
            return f"{base}/{DATABASE}?host=127.0.0.1,127.0.0.1&port={a.pg_port},{b.pg_port}"
        if form == "repeated":
            return f"{base}/{DATABASE}?host={a.address}&host={b.address}&target_session_attrs=read-write"
        if form == "proxy":
            return f"{base}127.0.0.1:{self.proxy_port}/{DATABASE}"
        raise ValueError(form)

    def url(self, node: Node, database: str = DATABASE) -> str:
        return f"postgresql://{SUPERUSER}@{node.address}/{database}"

    # --- starting and stopping ------------------------------------------------------------

    def _spawn(self, argv: list[str], log: Path, *, as_account: bool = True) -> subprocess.Popen[bytes]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root), "LANG": "C.UTF-8"}
        identity = {}
        if as_account and self.account is not None:
            identity = {"user": self.account.pw_uid, "group": self.account.pw_gid, "extra_groups": []}
        with log.open("ab") as sink:
            return subprocess.Popen(argv, env=env, cwd=self.root, stdin=subprocess.DEVNULL, stdout=sink,
                                    stderr=subprocess.STDOUT, **identity)  # type: ignore[arg-type]

    def _own(self, path: Path) -> None:
        if self.account is not None:
            os.chown(path, self.account.pw_uid, self.account.pw_gid)

    def start(self) -> None:
        """etcd, the first node (the leader), the second (its synchronous standby), the database, haproxy."""
        self._own(self.root)
        self._start_etcd()
        for node in self.nodes:
            node.root.mkdir(mode=0o700)
            self._own(node.root)
            node.config.write_text(json.dumps(self._patroni_config(node), indent=1))  # YAML reads JSON
            self._own(node.config)
        self.start_node(self.nodes[0])
        wait_for(self.nodes[0].is_leader, what="the first Patroni node to lead", timeout=START_TIMEOUT,
                 explain=self.explain)
        asyncio.run(self._create_database())
        self.start_node(self.nodes[1])
        self.wait_healthy()
        self._start_haproxy()

    def _start_etcd(self) -> None:
        data = self.root / "etcd"
        peer = f"http://127.0.0.1:{self.etcd_peer}"
        client = f"http://127.0.0.1:{self.etcd_port}"
        self.etcd = self._spawn([_program("etcd"), "--enable-v2=true", "--name", "e0", "--data-dir", str(data),
                                 "--listen-client-urls", client, "--advertise-client-urls", client,
                                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                 "--initial-cluster", f"e0={peer}", "--initial-cluster-token", self.scope],
                                self.root / "etcd.log")

        def healthy() -> bool:
            if self.etcd is not None and self.etcd.poll() is not None:
                pytest.fail(f"etcd exited with {self.etcd.returncode}:\n{_tail(self.root / 'etcd.log')}")
            with httpx.Client(timeout=2.0, trust_env=False) as http:
                return http.get(f"{client}/health").json().get("health") == "true"

        wait_for(healthy, what="etcd", timeout=START_TIMEOUT, ignoring=(httpx.HTTPError, ValueError),
                 explain=lambda: _tail(self.root / "etcd.log"))

    def _patroni_config(self, node: Node) -> dict[str, object]:
        trust = ["local all all trust", "host all all 127.0.0.1/32 trust", "host replication all 127.0.0.1/32 trust"]
        return {
            "scope": self.scope, "name": node.name, "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{node.api_port}", "connect_address": f"127.0.0.1:{node.api_port}"},
            "etcd": {"host": f"127.0.0.1:{self.etcd_port}"},
            "bootstrap": {
                "dcs": {"ttl": TTL, "loop_wait": LOOP_WAIT, "retry_timeout": RETRY_TIMEOUT,
                        "maximum_lag_on_failover": 1 << 20, "synchronous_mode": True,
                        "postgresql": {"use_pg_rewind": True, "use_slots": True,
                                       "parameters": {"synchronous_commit": "on", "wal_log_hints": "on",
                                                      "max_connections": 200, "timezone": "UTC"}}},
                "initdb": [{"encoding": "UTF8"}, "no-locale", "no-sync"],
                "pg_hba": trust,
            },
            "postgresql": {
                "listen": node.address, "connect_address": node.address, "data_dir": str(node.data),
                "bin_dir": str(self.bin), "pgpass": str(node.root / "pgpass"), "pg_hba": trust,
                "authentication": {"superuser": {"username": SUPERUSER, "password": "unused"},
                                   "replication": {"username": SUPERUSER, "password": "unused"},
                                   "rewind": {"username": SUPERUSER, "password": "unused"}},
                "parameters": {"unix_socket_directories": str(node.root)},
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
        }

    def start_node(self, node: Node) -> None:
        """Start (or restart, after ``kill``) a node's Patroni; it starts and manages its PostgreSQL."""
        node.process = self._spawn([_program("patroni"), str(node.config)], node.log)

    async def _create_database(self) -> None:
        conn = await asyncpg.connect(self.url(self.nodes[0], "postgres"), timeout=10)
        try:
            await conn.execute(f'CREATE DATABASE "{DATABASE}"')
            await conn.execute("CREATE TABLE harness_probe (node text, at timestamptz)")  # WriteProbe's, in postgres
        finally:
            await conn.close()

    def _start_haproxy(self) -> None:
        a, b = self.nodes
        config = self.root / "haproxy.cfg"
        config.write_text(f"""global
    maxconn 400
defaults
    mode tcp
    timeout connect 2s
    timeout client 30m
    timeout server 30m
    timeout check 1s
listen primary
    bind 127.0.0.1:{self.proxy_port}
    option httpchk GET /primary
    http-check expect status 200
    default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
    server {a.name} {a.address} check port {a.api_port}
    server {b.name} {b.address} check port {b.api_port}
""")
        self.haproxy = self._spawn([_program("haproxy"), "-db", "-f", str(config)], self.root / "haproxy.log",
                                   as_account=False)

        async def answers() -> bool:
            conn = await asyncpg.connect(self.dsn("proxy"), timeout=2)
            try:
                return bool(await conn.fetchval("SELECT NOT pg_is_in_recovery()"))
            finally:
                await conn.close()

        wait_for(lambda: asyncio.run(answers()), what="haproxy to reach the leader", timeout=START_TIMEOUT,
                 ignoring=(OSError, asyncpg.PostgresError, asyncpg.InterfaceError), explain=self.explain)

    def stop(self) -> None:
        """Thaw what is frozen, stop haproxy, each Patroni (which stops its PostgreSQL), etcd; by PID."""
        for node in self.nodes:
            self.thaw(node)
        _stop(self.haproxy, signal.SIGTERM)
        for node in self.nodes:
            postmaster = _postmaster_pid(node.data)
            if not _stop(node.process, signal.SIGTERM) and postmaster is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(postmaster[0], signal.SIGKILL)
            if postmaster is not None:  # detached from Patroni: wait until it is gone (PID 1 reaps it)
                wait_for(lambda pid=postmaster[0]: not _alive(pid), what="the postmaster to exit",
                         timeout=STOP_TIMEOUT)
        _stop(self.etcd, signal.SIGTERM)

    # --- the cluster's state ----------------------------------------------------------------

    def leader(self) -> Node | None:
        """The node Patroni's REST API names the running primary (None: none, or not yet)."""
        return next((node for node in self.nodes if node.is_leader()), None)

    def other(self, node: Node) -> Node:
        return self.nodes[1 - self.nodes.index(node)]

    def wait_healthy(self, timeout: float = START_TIMEOUT) -> Node:
        """Block until one node leads and the other streams from it as its synchronous standby; the leader."""

        def healthy() -> Node | None:
            leader = self.leader()
            if leader is None:
                return None
            members = leader.api("/cluster").json()["members"]
            standby = [m for m in members if m["role"] == "sync_standby" and m["state"] in {"running", "streaming"}]
            return leader if standby else None

        return wait_for(healthy, what="a leader with a synchronous standby", timeout=timeout,
                        ignoring=(httpx.HTTPError, KeyError, ValueError), explain=self.explain)

    def explain(self) -> str:
        """The tail of every log (for a failed wait)."""
        logs = [self.root / "etcd.log", self.root / "haproxy.log", *(node.log for node in self.nodes)]
        return "\n".join(f"--- {log.name} ({log.parent.name})\n{_tail(log)}" for log in logs)

    # --- faults -----------------------------------------------------------------------------

    def kill(self, node: Node) -> None:
        """``kill -9`` of the node's Patroni and every PostgreSQL process: a machine gone at once."""
        for pid in node.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if node.process is not None:
            node.process.wait(timeout=STOP_TIMEOUT)

    def freeze(self, node: Node) -> None:
        """SIGSTOP of the node's Patroni and PostgreSQL: a hung VM (TCP still accepts, nothing answers)."""
        node.frozen = node.processes()
        for pid in node.frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def thaw(self, node: Node) -> None:
        """SIGCONT of every process ``freeze`` stopped."""
        for pid in node.frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        node.frozen = []

    def switchover(self, leader: Node, candidate: Node) -> None:
        """``patronictl switchover`` from ``leader`` to ``candidate`` (what an operator runs for maintenance)."""
        done = subprocess.run([_program("patronictl"), "-c", str(leader.config), "switchover", "--leader",
                               leader.name, "--candidate", candidate.name, "--force"], capture_output=True,
                              text=True, timeout=START_TIMEOUT, check=False, cwd=self.root,
                              env={"PATH": os.environ.get("PATH", ""), "HOME": str(self.root)})
        assert done.returncode == 0, f"patronictl switchover failed:\n{done.stdout}\n{done.stderr}"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _stop(process: subprocess.Popen[bytes] | None, sig: signal.Signals) -> bool:
    """Signal ``process`` by PID and wait (bounded); SIGKILL if it does not exit. Whether it exited on ``sig``."""
    if process is None or process.poll() is not None:
        return True
    process.send_signal(sig)
    try:
        process.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=STOP_TIMEOUT)
        return False
    return True


@contextmanager
def patroni_cluster() -> Iterator[PatroniCluster]:
    """A started PatroniCluster in a fresh temporary directory, always stopped and removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="imds-patroni-"))
    cluster = PatroniCluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        try:
            cluster.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)
