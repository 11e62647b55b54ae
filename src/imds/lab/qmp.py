"""QEMU's machine protocol (QMP) over the run's Unix socket: attach and detach devices of a running guest.

QMP is JSON, one object per line: the server greets, the client sends ``qmp_capabilities``,
then each ``{"execute": NAME, "arguments": {...}}`` gets ``{"return": ...}`` or ``{"error":
{"class", "desc"}}``; ``{"event": ...}`` lines come in between whenever QEMU has something to
say (``DEVICE_DELETED`` once a guest let a device go). ``Qmp`` keeps the events it read so a
caller can wait for one.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any, Self

from imds.errors import LabError

TIMEOUT = 30.0


class Qmp:
    """One QMP connection (commands run one at a time)."""

    def __init__(self, path: Path, timeout: float = TIMEOUT) -> None:
        """Connect to ``path``, read the greeting and leave capabilities negotiation."""
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._buffer = b""
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(str(path))
        except OSError as exc:
            self._sock.close()
            raise LabError(f"QMP {path}: {exc}") from exc
        greeting = self._read()
        if "QMP" not in greeting:
            self.close()
            raise LabError(f"QMP {path}: no greeting ({greeting})")
        self.execute("qmp_capabilities")

    def close(self) -> None:
        """Close the connection."""
        self._sock.close()

    def __enter__(self) -> Self:
        """Itself."""
        return self

    def __exit__(self, *_exc: object) -> None:
        """Close."""
        self.close()

    def execute(self, name: str, **arguments: Any) -> Any:
        """Run one command; its ``return`` value, or LabError with QEMU's description."""
        message: dict[str, Any] = {"execute": name}
        if arguments:
            message["arguments"] = arguments
        try:
            self._sock.sendall(json.dumps(message).encode() + b"\n")
        except OSError as exc:
            raise LabError(f"QMP {name}: {exc}") from exc
        while True:
            answer = self._read()
            if "return" in answer:
                return answer["return"]
            if "error" in answer:
                error = answer["error"]
                raise LabError(f"QMP {name}: {error.get('class')}: {error.get('desc')}")

    def wait_event(self, event: str, timeout: float, **data: Any) -> dict[str, Any]:
        """The first event called ``event`` whose data holds ``data`` (read so far or arriving within ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            for seen in self.events:
                if seen.get("event") == event and all(seen.get("data", {}).get(k) == v for k, v in data.items()):
                    return seen
            left = deadline - time.monotonic()
            if left <= 0:
                raise LabError(f"QMP: no {event} {data} within {timeout:.0f}s")
            self._sock.settimeout(left)
            try:
                self._read()
            except LabError:
                continue
            finally:
                self._sock.settimeout(TIMEOUT)

    def _read(self) -> dict[str, Any]:
        """The next message (an event is also kept in ``events``)."""
        while b"\n" not in self._buffer:
            try:
                chunk = self._sock.recv(65536)
            except OSError as exc:
                raise LabError(f"QMP {self.path}: {exc}") from exc
            if not chunk:
                raise LabError(f"QMP {self.path}: QEMU closed the connection")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line) if line.strip() else {}
        if "event" in message:
            self.events.append(message)
        return message
