"""The ``imds serve`` a lab guest reads from: the lab's own, or one the operator names.

The lab's own runs from ``imds`` beside this interpreter with SQLite in the run directory,
a free loopback port, a random admin token (in the environment, never on a command line),
trusting the agent's haproxy on 127.0.0.1 with the run's shared secret, and logging every
instance read (``--log-instance-reads``): the requests the guest made, with their times.
With ``--url`` the operator's server must already trust 127.0.0.1 with the secret given.
"""

from __future__ import annotations

import json
import secrets
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from imds.errors import LabError
from imds.lab.run import Cleanup, spawn, tool_env, write_private

START_TIMEOUT = 60.0


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """Where the records go and the guest's reads end up."""

    url: str
    token: str
    log: Path | None = None  # the lab's own server's log (JSON lines)

    def _client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10.0, trust_env=False,
                            headers={"Authorization": f"Bearer {self.token}"})

    def post(self, path: str, body: dict[str, Any]) -> None:
        """An admin write; LabError unless it was applied."""
        try:
            with self._client() as client:
                answer = client.post(path, json=body)
        except httpx.HTTPError as exc:
            raise LabError(f"POST {self.url}{path}: {exc}") from exc
        if answer.status_code != 200 or not answer.json().get("applied"):
            raise LabError(f"POST {self.url}{path} answered {answer.status_code}: {answer.text[:500]}")

    def get(self, path: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """An admin read's JSON object; LabError unless it answered 200."""
        try:
            with self._client() as client:
                answer = client.get(path, params=params)
        except httpx.HTTPError as exc:
            raise LabError(f"GET {self.url}{path}: {exc}") from exc
        if answer.status_code != 200:
            raise LabError(f"GET {self.url}{path} answered {answer.status_code}: {answer.text[:500]}")
        found: dict[str, Any] = answer.json()
        return found

    def push(self, uuid: str, addresses: list[str], metadata: dict[str, Any], userdata: bytes) -> None:
        """The guest's record: metadata, then userdata."""
        self.post("/device-metadata", {"id": uuid, "ipAddresses": addresses, "metadata": metadata})
        self.post("/device-userdata", {"id": uuid, "ipAddresses": addresses, "userdata": userdata.decode()})

    def reads(self, since: float) -> list[dict[str, Any]]:
        """The instance reads the lab's own server logged after ``since`` (wall clock): t (seconds), path, status."""
        if self.log is None or not self.log.exists():
            return []
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if not isinstance(entry, dict) or entry.get("event") != "instance.read":
                continue
            at = datetime.fromisoformat(str(entry["timestamp"])).timestamp()
            if at >= since:
                found.append({"t": round(at - since, 2), "path": entry.get("path"), "status": entry.get("status")})
        return found


def own_server(cleanup: Cleanup, out: Path, secret_file: Path, imdsv2: str, extra: Sequence[str] = ()) -> Server:
    """Start ``imds serve`` (with the ``extra`` arguments) for this run, stopped by PID at cleanup; wait until ready."""
    imds = Path(sys.executable).parent / "imds"
    port = free_port()
    token = secrets.token_urlsafe(24)
    write_private(out / "admin-token", f"{token}\n".encode())
    env = {k: v for k, v in tool_env().items() if not k.startswith("IMDS_") and "proxy" not in k.lower()}
    env.update(IMDS_ADMIN_TOKEN=token, HOME=str(out))
    log = out / "serve.log"
    log.unlink(missing_ok=True)
    args = [str(imds) if imds.exists() else "imds", "serve", "--listen", f"127.0.0.1:{port}",
            "--db", f"sqlite:///{(out / 'imds.sqlite').resolve()}", "--trusted-proxy", "127.0.0.1/32",
            "--proxy-shared-secret-file", str(secret_file), "--log-instance-reads", "--imdsv2", imdsv2, *extra]
    process = cleanup.process("imds serve", spawn(args, log, env=env))
    server = Server(f"http://127.0.0.1:{port}", token, log)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LabError(f"imds serve exited {process.returncode}:\n{log.read_text(errors='replace')[-2000:]}")
        if _ready(server.url):
            return server
        time.sleep(0.2)
    raise LabError(f"imds serve not ready within {START_TIMEOUT:.0f}s; see {log}")


def _ready(url: str) -> bool:
    try:
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            answer = client.get(f"{url}/readyz")
    except httpx.HTTPError:
        return False
    return answer.status_code == 200


def remote_server(url: str, token: str | None) -> Server:
    """An operator's ``imds serve``; ``token``: ``--admin-token``, else IMDS_ADMIN_TOKEN (``imds lab``'s config)."""
    if not token:
        msg = "--url needs an admin token: --admin-token or IMDS_ADMIN_TOKEN"
        raise LabError(msg)
    return Server(url.rstrip("/"), token)
