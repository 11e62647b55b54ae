"""The run's private userspace Open vSwitch, in the run's own network namespace (``imds.lab.hostns``).

``ovsdb-server`` and ``ovs-vswitchd --disable-system`` run from a short directory under /tmp
(unix socket paths are short), as children of the lab, stopped by PID; their logs are kept in
the run directory. The tools (``ovs-vsctl``, ``ovs-ofctl``) reach them through those sockets
from anywhere.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from imds.agent.flows import LEARN_COOKIE, RETURN_TABLE
from imds.errors import LabError
from imds.lab.hostns import HostNs
from imds.lab.run import Cleanup, sh, spawn, tool_env, wait_until

READY_TIMEOUT = 60.0


class Switch:
    """A private userspace Open vSwitch."""

    def __init__(self, cleanup: Cleanup, out: Path, tag: str, namespace: HostNs) -> None:
        """Start ovsdb-server and ovs-vswitchd in ``namespace`` (both undone by PID, their logs kept in ``out``)."""
        self.root = Path(tempfile.mkdtemp(prefix=f"imdslab-{tag}-", dir="/tmp"))  # unix socket paths are short
        cleanup.add(f"remove {self.root}", lambda: shutil.rmtree(self.root, ignore_errors=True))
        cleanup.add("keep the OVS logs", lambda: self._keep_logs(out))
        db = self.root / "conf.db"
        sh("ovsdb-tool", "create", str(db), "/usr/share/openvswitch/vswitch.ovsschema", env=self.env)
        cleanup.process("ovsdb-server", spawn(
            [*namespace.exec, "ovsdb-server", str(db), f"--remote=punix:{self.db_sock}", "--pidfile", "--log-file"],
            self.root / "ovsdb-server.out", env=self.env))
        wait_until("ovsdb-server", self.db_sock.exists, READY_TIMEOUT)
        self.vsctl("--no-wait", "init")
        # Its netdev datapath's tap, "ovs-netdev", is the namespace's own: no other switch is in the way.
        switch = cleanup.process("ovs-vswitchd", spawn(
            [*namespace.exec, "ovs-vswitchd", f"unix:{self.db_sock}", "--disable-system", "--pidfile", "--log-file"],
            self.root / "ovs-vswitchd.out", env=self.env))

        def configured() -> bool:
            if switch.poll() is not None:
                raise LabError(f"ovs-vswitchd exited {switch.returncode}; see {self.root}")
            # A write without --no-wait returns once ovs-vswitchd has applied it.
            try:
                sh("ovs-vsctl", f"--db=unix:{self.db_sock}", "--timeout=2", "set", "Open_vSwitch", ".",
                   "external_ids:imds-lab=ready", env=self.env, timeout=10.0)
            except LabError:
                return False
            return True

        wait_until("ovs-vswitchd", configured, READY_TIMEOUT)

    @property
    def env(self) -> dict[str, str]:
        """The environment OVS tools need to find this switch's files."""
        return tool_env(**{f"OVS_{name}": str(self.root) for name in ("RUNDIR", "DBDIR", "LOGDIR", "SYSCONFDIR")})

    def learned(self, bridge: str) -> bool:
        """Whether the agent's egress rule has learned a way back: the guest's first metadata packet went by."""
        try:
            text = self.ofctl("--no-stats", "dump-flows", bridge, f"table={RETURN_TABLE}")
        except LabError:
            return False
        return f"cookie={LEARN_COOKIE >> 32:#x}" in text

    @property
    def db_sock(self) -> Path:
        """The OVSDB socket."""
        return self.root / "db.sock"

    def vsctl(self, *args: str) -> str:
        """``ovs-vsctl`` against this switch."""
        return sh("ovs-vsctl", f"--db=unix:{self.db_sock}", "--timeout=20", *args, env=self.env)

    def ofctl(self, *args: str) -> str:
        """``ovs-ofctl`` against this switch."""
        return sh("ovs-ofctl", *args, env=self.env)

    def _keep_logs(self, out: Path) -> None:
        for log in self.root.glob("*.log"):
            shutil.copyfile(log, out / f"ovs-{log.name}")
