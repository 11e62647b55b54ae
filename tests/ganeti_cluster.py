"""A real one-node Ganeti 3.0 cluster (Debian's ``ganeti`` package), isolated, with imds in ganeti-metad's place.

``ganeti_cluster(base)`` builds it and yields a ``Cluster``; ``imds_as_metad(cluster)`` runs
``imds serve`` on Ganeti's metad socket inside it; ``instance_netns(cluster, address)`` is the
instance's end of the communication link. Nothing of the host is written:

- **network**: a namespace (``netns_guest``: a veth to the root namespace, 198.18.x.y/30) whose
  inside address is the node's primary IP; the cluster IP (192.0.2.1) goes on its ``lo``
  (``--master-netdev lo``), and so does 169.254.169.254/32, where imds listens for instances.
- **files, names, processes**: inside that namespace, ``unshare --mount --uts --pid --fork
  --kill-child --mount-proc``: hostname ``node1``, a tmpfs on /run (/run/ganeti, /run/lock), and
  temp dirs bind-mounted on /var/lib/ganeti, /var/log/ganeti, /srv (Ganeti's first OS search path
  entry and the file storage dir), /etc/hosts and /etc/ganeti (a copy). PID 1 there is a bash
  loop; Ganeti's daemons (``daemon-util`` via ``start-stop-daemon``) detach to it.
- **teardown**: SIGKILL to the ``unshare`` process (its PID) kills the namespace's PID 1
  (``--kill-child``), and with it every daemon in the namespace; the mounts go with the last
  process, then the network namespace is deleted.

imds runs in the same namespaces (the node daemon must see its PID): ``sh -c 'echo $$ >
/run/ganeti/ganeti-metad.pid; exec imds serve --ganeti-metad-socket /run/ganeti/socket/ganeti-metad
…'``. Before each push the node daemon checks that PID and starts Ganeti's own metad when it is
not alive (``backend.ModifyInstanceMetadata``), which ``metad_started`` reports. The admin API
listens on the node's primary address, reachable from the test through the veth.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import wait_for
from netns_guest import Guest, netns_guest, run
from serve_process import ADMIN_TOKEN, IMDS, START_TIMEOUT, STOP_TIMEOUT, Server, clean_env

GANETI_TOOLS = ("gnt-cluster", "gnt-instance", "ganeti-noded", "nsenter", "unshare", "ip")
CLUSTER_NAME, CLUSTER_IP, NODE_NAME = "cluster1", "192.0.2.1", "node1"
METADATA_IP = "169.254.169.254"
ADMIN_PORT = 8000  # on the node's primary address, in the node's own network namespace (nothing else there)
COMMUNICATION_NETWORK = "gnt-com"  # gnt-cluster modify --instance-communication-network: 169.254.0.0/16
COMMAND_TIMEOUT = 300.0  # gnt-cluster init takes ~30 s on an idle 2-core box
# As Ganeti's tools/vcluster-setup suggests for a virtual cluster: instances of any small size.
IPOLICY = ("min:disk-size=0,cpu-count=1,disk-count=0,memory-size=1,nic-count=0,spindle-use=0"
           "/max:disk-size=1048576,cpu-count=8,disk-count=16,memory-size=32768,nic-count=8,spindle-use=12")
# PID 1 of the cluster's namespaces: private mounts over Ganeti's directories, then reap until killed.
INIT = """set -eu
base=$1
hostname "$2"
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -m 1777 /run/lock
mount --bind "$base/etc-ganeti" /etc/ganeti
mount --bind "$base/lib" /var/lib/ganeti
mount --bind "$base/log" /var/log/ganeti
mount --bind "$base/srv" /srv
mount --bind "$base/hosts" /etc/hosts
touch "$base/ready"
while :; do sleep 1; done
"""


def require_ganeti() -> None:
    """Root and Debian's ``ganeti`` package (scripts/test installs it): fail, never skip."""
    if os.geteuid() != 0:
        pytest.fail("the Ganeti cluster needs root (namespaces, mounts)")
    missing = [tool for tool in GANETI_TOOLS if shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None]
    if missing or not Path("/etc/ganeti").is_dir():
        pytest.fail(f"Debian's ganeti package is not installed ({', '.join(missing) or '/etc/ganeti'} missing): "
                    "run scripts/test, or apt-get install --no-install-recommends ganeti")


@dataclass(frozen=True)
class Cluster:
    """The running cluster: its temp dir, the node's namespace, and the PIDs that end it."""

    base: Path
    node: Guest  # netns, the node's primary address, the root namespace's end of the veth
    process: subprocess.Popen[bytes]  # unshare (killing it ends the PID namespace)
    init: int  # host PID of the namespace's PID 1

    @property
    def os_dir(self) -> Path:
        """Where to put OS definitions: /srv/ganeti/os inside (Ganeti's first OS search path entry)."""
        return self.base / "srv" / "ganeti" / "os"

    def inside(self, path: Path) -> str:
        """The path the cluster sees for ``path``, a host path under its /srv (file disks live there)."""
        return str(Path("/srv") / path.relative_to(self.base / "srv"))

    def run(self, *argv: str, timeout: float = COMMAND_TIMEOUT) -> subprocess.CompletedProcess[str]:
        """``argv`` inside every namespace of the cluster (never checked: see ``gnt``)."""
        return subprocess.run(["nsenter", "-t", str(self.init), "-m", "-u", "-n", "-p", "--", *argv], cwd="/",
                              capture_output=True, text=True, timeout=timeout, check=False)

    def gnt(self, *argv: str, timeout: float = COMMAND_TIMEOUT) -> str:
        """A Ganeti command that must succeed; its stdout. A failure shows its output and the daemons' logs."""
        done = self.run(*argv, timeout=timeout)
        if done.returncode != 0:
            pytest.fail(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}\n{self.logs()}")
        return done.stdout

    def logs(self, lines: int = 30) -> str:
        """The last lines of each Ganeti daemon log, for failure messages."""
        parts = []
        for log in sorted((self.base / "log").glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    def metad_started(self) -> bool:
        """Whether the node daemon ever started Ganeti's own ganeti-metad (it logs its start there)."""
        return (self.base / "log" / "meta-daemon.log").exists()

    def processes(self) -> list[list[str]]:
        """The command line of every process in the cluster's PID namespace (read from the host's /proc)."""
        namespace = Path(f"/proc/{self.init}/ns/pid").readlink()
        found = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and (proc / "ns" / "pid").readlink() == namespace:
                    found.append((proc / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1])
            except OSError:  # gone meanwhile
                continue
        return found


def _prepare(base: Path, node: Guest) -> None:
    for sub in ("lib", "log", "srv/ganeti/os", "srv/ganeti/file-storage"):
        (base / sub).mkdir(parents=True)
    shutil.copytree("/etc/ganeti", base / "etc-ganeti", symlinks=True)
    # gnt-cluster init refuses a --file-storage-dir that this file does not allow.
    (base / "etc-ganeti" / "file-storage-paths").write_text("/srv/ganeti/file-storage\n")
    (base / "hosts").write_text(f"127.0.0.1 localhost\n{node.address} {NODE_NAME}\n{CLUSTER_IP} {CLUSTER_NAME}\n")
    run("ip", "netns", "exec", node.netns, "ip", "addr", "add", f"{METADATA_IP}/32", "dev", "lo")
    run("ip", "netns", "exec", node.netns, "ip", "link", "set", "lo", "up")


def _child(pid: int) -> int:
    """The single child of ``pid`` (unshare's and nsenter's fork), polled until it exists."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    found = wait_for(lambda: children.read_text().split(), what=f"the child of PID {pid}", timeout=START_TIMEOUT,
                     ignoring=(OSError,))
    return int(found[0])


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


@contextmanager
def ganeti_cluster(base: Path) -> Iterator[Cluster]:
    """``gnt-cluster init`` (fake hypervisor; diskless and file disks) with the instance communication network.

    ``base`` must be empty; it holds everything the cluster writes. Stopped by PID afterwards.
    """
    require_ganeti()
    with netns_guest("gc", 18) as node:
        _prepare(base, node)
        command = ["ip", "netns", "exec", node.netns, "unshare", "--mount", "--uts", "--pid", "--fork",
                   "--kill-child", "--mount-proc", "--propagation", "private", "bash", "-c", INIT, "init", str(base),
                   NODE_NAME]
        with (base / "init.log").open("wb") as sink:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
        init = None
        try:
            init = _child(process.pid)
            wait_for(lambda: (base / "ready").exists() or process.poll() is not None, what="the cluster's mounts",
                     timeout=START_TIMEOUT)
            if process.poll() is not None:
                pytest.fail(f"the cluster's namespace exited: {(base / 'init.log').read_text()}")
            cluster = Cluster(base, node, process, init)
            cluster.gnt("gnt-cluster", "init", "--no-etc-hosts", "--no-ssh-init", "--master-netdev=lo",
                        "--enabled-hypervisors=fake", "--enabled-disk-templates=file,diskless",
                        "--file-storage-dir=/srv/ganeti/file-storage", f"--ipolicy-bounds-specs={IPOLICY}",
                        CLUSTER_NAME)
            cluster.gnt("gnt-cluster", "modify", f"--instance-communication-network={COMMUNICATION_NETWORK}")
            yield cluster
        finally:
            process.kill()  # unshare: --kill-child takes the namespace's PID 1, and so every daemon, with it
            process.wait(timeout=STOP_TIMEOUT)
            if init is not None:
                wait_for(lambda: _gone(init), what="the cluster's PID namespace to end", timeout=START_TIMEOUT)


class NamespacedServer(Server):
    """``imds serve`` started through nsenter: stopped by signalling its own PID (nsenter forwards no signal)."""

    def __init__(self, process: subprocess.Popen[bytes], url: str, log: Path, pid: int) -> None:
        super().__init__(process, url, log)
        self.pid = pid

    def stop(self) -> int:
        """SIGTERM to imds's PID, bounded; SIGKILL if it does not exit. Returns nsenter's exit status."""
        if not _gone(self.pid):
            os.kill(self.pid, signal.SIGTERM)
        try:
            return self.process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            return self.process.wait(timeout=STOP_TIMEOUT)


@contextmanager
def imds_as_metad(cluster: Cluster, *args: str) -> Iterator[NamespacedServer]:
    """``imds serve`` on /run/ganeti/socket/ganeti-metad, instances on 169.254.169.254:80, admin on the node's IP.

    Its PID as the cluster's PID namespace sees it goes into /run/ganeti/ganeti-metad.pid. No OS
    flag: imds reads the definitions from Ganeti's search path as a node does, /srv/ganeti/os
    (``cluster.os_dir``) first; put them there before it starts. Stopped by PID afterwards.
    """
    data = cluster.base / "imds"
    data.mkdir()
    admin = f"{cluster.node.address}:{ADMIN_PORT}"
    serve = [str(IMDS), "serve", "--listen", f"{METADATA_IP}:80", "--admin-listen", admin, "--ganeti-metad-socket",
             "/run/ganeti/socket/ganeti-metad", "--db", f"sqlite:///{data / 'imds.db'}", "--rate-limit", "0", *args]
    script = 'echo $$ > /run/ganeti/ganeti-metad.pid && exec "$@"'
    command = ["nsenter", "-t", str(cluster.init), "-m", "-u", "-n", "-p", "--", "sh", "-c", script, "sh", *serve]
    log = cluster.base / "imds.log"
    env = clean_env(data, IMDS_ADMIN_TOKEN=ADMIN_TOKEN)
    del env["IMDS_GANETI_OS_SEARCH_PATH"]  # the default, as on a node: the cluster's own /srv is mounted here
    with log.open("wb") as sink:
        process = subprocess.Popen(command, cwd="/", env=env,
                                   stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
    try:
        pid = _child(process.pid)
    except BaseException:
        process.kill()  # nsenter, before it had a child
        raise
    server = NamespacedServer(process, f"http://{admin}", log, pid)
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


@contextmanager
def instance_netns(cluster: Cluster, address: str) -> Iterator[Guest]:
    """The instance's side of its communication NIC: a namespace at ``address``/16 on a veth from the node.

    The node's end is set up as Ganeti's ``kvm-ifup-os`` sets up a communication tap (a /32 route
    to the instance); 169.254.169.254 is on the node's ``lo``. Removed afterwards.
    """
    suffix = secrets.token_hex(3)
    netns, outside, inside = f"gcI{suffix}", f"gck{suffix}", f"gcj{suffix}"
    run("ip", "netns", "add", netns)
    try:
        run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        run("ip", "link", "set", outside, "netns", cluster.node.netns)
        run("ip", "link", "set", inside, "netns", netns)
        in_node = ("ip", "netns", "exec", cluster.node.netns)
        run(*in_node, "ip", "link", "set", outside, "up")
        run(*in_node, "ip", "route", "add", f"{address}/32", "dev", outside)
        run("ip", "netns", "exec", netns, "ip", "addr", "add", f"{address}/16", "dev", inside)
        run("ip", "netns", "exec", netns, "ip", "link", "set", inside, "up")
        yield Guest(netns, address, METADATA_IP)
    finally:
        run("ip", "netns", "del", netns, check=False)  # takes both veth ends with it
    assert netns not in run("ip", "netns", "list").stdout


__all__ = ["Cluster", "NamespacedServer", "ganeti_cluster", "imds_as_metad", "instance_netns", "require_ganeti"]
