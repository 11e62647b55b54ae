"""The guest's serial console, read as it grows: the witness of what the guest did.

cloud-init writes its stage banners to the console::

    Cloud-init v. 22.4.2 running 'init' at Fri, 27 Nov 2026 02:50:01 +0000. Up 21.52 seconds.
    Cloud-init v. 22.4.2 finished at Fri, ... Datasource DataSourceEc2.  Up 48.10 seconds

so the console says which datasource it chose and when its final stage ended (guest uptime).
The lab's userdata prints a marker line naming the hostname the guest then has
(``LAB-MARKER host=NAME``), and getty's prompt (``NAME login:``) names it too; with
``--ganeti-install`` the guest also prints ``LAB-GANETI exit=N`` when its install ended. ``Console.poll``
reads what is new and notes the host's clock when each milestone first appears.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

_ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
_FINISHED = re.compile(r"Cloud-init v\. (\S+) finished at .*?Datasource (DataSource\w+).*?Up ([\d.]+) seconds")
_STAGE = re.compile(r"Cloud-init v\. \S+ running '([\w:-]+)' at .*?Up ([\d.]+) seconds")
_LOGIN = re.compile(r"^(\S+) login:")
_KERNEL = "Linux version "


@dataclass
class Console:
    """Milestones found so far in one serial log (times: ``time.time()`` when first read)."""

    path: Path
    marker: str
    hostname: str
    offset: int = 0
    partial: bytes = b""
    seen: dict[str, float] = field(default_factory=dict)  # milestone -> wall clock
    stages: dict[str, float] = field(default_factory=dict)  # cloud-init stage -> guest uptime at its start
    datasource: str | None = None
    version: str | None = None
    final_uptime: float | None = None
    login_host: str | None = None
    marker_line: str | None = None
    install: str | None = None  # with --ganeti-install: the start of the guest's "LAB-GANETI exit=N" line
    install_exit: int | None = None

    def poll(self) -> None:
        """Read what the guest wrote since the last poll and note new milestones."""
        try:
            with self.path.open("rb") as log:
                log.seek(self.offset)
                chunk = log.read()
        except FileNotFoundError:
            return
        self.offset += len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        now = time.time()
        for raw in lines:
            self._line(_ANSI.sub(b"", raw).decode(errors="replace").strip("\r\x00 "), now)

    def _note(self, milestone: str, now: float) -> None:
        self.seen.setdefault(milestone, now)

    def _line(self, line: str, now: float) -> None:
        if _KERNEL in line:
            self._note("kernel", now)
        if stage := _STAGE.search(line):
            self.stages.setdefault(stage.group(1), float(stage.group(2)))
            self._note(f"cloud-init {stage.group(1)}", now)
        if finished := _FINISHED.search(line):
            self.version, self.datasource = finished.group(1), finished.group(2)
            self.final_uptime = float(finished.group(3))
            self._note("cloud-init final", now)
        if self.marker in line and "echo" not in line:  # not cloud-init echoing the userdata back
            self.marker_line = self.marker_line or line
            self._note("marker", now)
            if f"host={self.hostname}" in line.split():
                self._note("hostname", now)
        if self.install and self.install in line and "echo" not in line:
            found = re.search(rf"{re.escape(self.install)} exit=(\d+)", line)
            if found and self.install_exit is None:
                self.install_exit = int(found.group(1))
                self._note("ganeti install", now)
        if login := _LOGIN.match(line):
            self.login_host = login.group(1)
            self._note("login", now)
            if login.group(1) == self.hostname:
                self._note("hostname", now)

    def finished_with(self, datasource: str) -> bool:
        """Whether cloud-init finished with ``datasource`` (a prefix: DataSourceNoCloud covers NoCloudNet)."""
        return self.datasource is not None and self.datasource.startswith(datasource)

    def done(self, datasource: str) -> bool:
        """Everything a passing boot shows: the datasource, the marker, the hostname (and the install's end)."""
        shown = self.finished_with(datasource) and "marker" in self.seen and "hostname" in self.seen
        return shown and (self.install is None or "ganeti install" in self.seen)

    def text(self) -> str:
        """The whole log so far (for messages)."""
        return self.path.read_text(errors="replace") if self.path.exists() else ""
