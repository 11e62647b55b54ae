"""The real ``ganeti-metad`` (Debian's ganeti-haskell-3.0) and the node daemon's client (ganeti-3.0).

Nothing is installed here: ``scripts/test`` downloads and unpacks both packages into
``.cache/ganeti`` (``scripts/ganeti.sh``), creates the gnt-* users the daemon looks up, and
installs libpcre3 and the client's python3-* modules. A missing piece fails the test with
what to run.

Both programs find their paths under ``GANETI_ROOTDIR`` (the Haskell ``Ganeti.Path`` and the
Python ``vcluster``; the client also wants ``GANETI_HOSTNAME``, the root's last component), so
the socket is ``<root>/var/run/ganeti/socket/ganeti-metad`` in a temp dir. metad reads OS
scripts from the fixed OS search path (``/srv/ganeti/os`` first), so it runs in a private
mount namespace where a temp dir is bind-mounted on ``/srv``: the host's ``/srv`` is untouched.
metad keys instances by the socket peer (no X-Forwarded-For), so reads come from 127.x sources.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from helpers import wait_for
from serve_process import free_port, stop_process

REPO = Path(__file__).parents[1]
GANETI = REPO / ".cache" / "ganeti" / "root"
METAD = GANETI / "usr" / "lib" / "ganeti" / "3.0" / "usr" / "sbin" / "ganeti-metad"
CLIENT_LIB = GANETI / "usr" / "share" / "ganeti" / "3.0"
PUSH = Path(__file__).parent / "ganeti_push.py"
SYSTEM_PYTHON = "/usr/bin/python3"
SOCKET = Path("var") / "run" / "ganeti" / "socket" / "ganeti-metad"
START_TIMEOUT = 60.0


def require_ganeti() -> None:
    """Fail (never skip) when scripts/test has not prepared Ganeti's packages."""
    missing = [str(p.relative_to(REPO)) for p in (METAD, CLIENT_LIB / "ganeti" / "metad.py") if not p.exists()]
    if missing:
        pytest.fail(f"Ganeti's Debian packages are not unpacked ({', '.join(missing)} missing): run scripts/test")


def node_root(base: Path, node: str = "node1") -> Path:
    """A Ganeti node root (``GANETI_ROOTDIR``) with the directories metad writes to."""
    root = base / node
    for sub in ("var/log/ganeti", "var/lib/ganeti", "var/run/ganeti/socket"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    return root


def push(root: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Ganeti's client pushes ``spec`` (see ganeti_push.py) to the daemon of node root ``root``."""
    if not (root / SOCKET).exists():
        pytest.fail(f"no daemon socket at {root / SOCKET}")  # the client would retry for minutes
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(CLIENT_LIB),
           "GANETI_ROOTDIR": str(root), "GANETI_HOSTNAME": root.name}
    done = subprocess.run([SYSTEM_PYTHON, str(PUSH)], input=json.dumps(spec), env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return answer


class Metad:
    """A running ganeti-metad: its HTTP base URL, node root and log."""

    def __init__(self, process: subprocess.Popen[bytes], url: str, root: Path) -> None:
        self.process = process
        self.url = url
        self.root = root

    def log(self) -> str:
        """The daemon's own log and its stdout/stderr."""
        logs = [self.root / "var/log/ganeti/meta-daemon.log", self.root / "metad.out"]
        return "\n".join(p.read_text(errors="replace") for p in logs if p.exists())

    def wait_ready(self) -> None:
        """Block (bounded) until the socket exists and the HTTP port accepts connections."""
        host, port = self.url.removeprefix("http://").split(":")
        def ready() -> bool:
            if self.process.poll() is not None:
                pytest.fail(f"ganeti-metad exited with {self.process.returncode}:\n{self.log()}")
            if not (self.root / SOCKET).exists():
                return False
            socket.create_connection((host, int(port)), timeout=1.0).close()
            return True

        wait_for(ready, what="ganeti-metad ready", timeout=START_TIMEOUT, ignoring=(OSError,), explain=self.log)


@contextmanager
def metad_running(root: Path, os_dir: Path) -> Iterator[Metad]:
    """ganeti-metad for node root ``root`` on 127.0.0.1, with ``os_dir`` as /srv/ganeti/os; stopped by PID."""
    require_ganeti()
    srv = os_dir.parents[1]
    if os_dir != srv / "ganeti" / "os":
        msg = f"{os_dir} must end in ganeti/os: it is mounted as /srv/ganeti/os"
        raise ValueError(msg)
    port = free_port()
    script = 'mount --bind "$1" /srv && exec "$2" -f --no-user-checks -p "$3" -b 127.0.0.1'
    command = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh",
               str(srv), str(METAD), str(port)]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GANETI_ROOTDIR": str(root)}
    with (root / "metad.out").open("wb") as sink:
        process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
    daemon = Metad(process, f"http://127.0.0.1:{port}", root)
    try:
        daemon.wait_ready()
        yield daemon
    finally:
        stop_process(process)


__all__ = ["SOCKET", "Metad", "metad_running", "node_root", "push", "require_ganeti"]
