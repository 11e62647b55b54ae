"""The guest's serial console, read as it grows: the witness of what the guest did.

cloud-init writes its stage banners to the console::

    Cloud-init v. 22.4.2 running 'init' at Fri, 27 Nov 2026 02:50:01 +0000. Up 21.52 seconds.
    Cloud-init v. 22.4.2 finished at Fri, ... Datasource DataSourceEc2.  Up 48.10 seconds

so the console says which datasource it chose and when its final stage ended (guest uptime).
The lab's userdata prints a marker line naming the hostname the guest then has
(``LAB-MARKER host=NAME``), and getty's prompt (``NAME login:``) names it too; with
``--ganeti-install`` the guest also prints ``LAB-GANETI exit=N`` when its install ended, and every guest
prints ``LAB-LATE ok ...`` when it could read its metadata again after cloud-init finished, or
``LAB-LATE failed ...``, its routes and ``LAB-LATE end`` (``imds.lab.late``). ``Console.poll``
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
DEVICES = "LAB-DEVICES"  # imds.lab.devices' watcher (here: the console stays free of lab imports)
GUEST_LOG = "LAB-GUESTLOG"


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
    late: str | None = None  # the start of the late read's lines ("LAB-LATE"); None: not checked
    late_line: str | None = None  # "LAB-LATE ok ..." or "LAB-LATE failed ..."
    late_report: list[str] = field(default_factory=list)  # after a failure: the guest's routes, up to "end"
    devices: dict[str, float] = field(default_factory=dict)  # --device-tags: each device line shown, when
    expect_devices: tuple[tuple[str, str], ...] = ()  # (start, also in it): device lines a passing boot shows
    guest_log: list[str] = field(default_factory=list)  # LAB-GUESTLOG lines: the guest's own logs, when it sent them

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
        self._lab_lines(line, now)
        if login := _LOGIN.match(line):
            self.login_host = login.group(1)
            self._note("login", now)
            if login.group(1) == self.hostname:
                self._note("hostname", now)

    def _lab_lines(self, line: str, now: float) -> None:
        """The lines of the lab's own parts: the install's exit, the late read's verdict and report."""
        if self.install and self.install in line and "echo" not in line:
            found = re.search(rf"{re.escape(self.install)} exit=(\d+)", line)
            if found and self.install_exit is None:
                self.install_exit = int(found.group(1))
                self._note("ganeti install", now)
        if GUEST_LOG in line:
            self.guest_log.append(line[line.index(GUEST_LOG) + len(GUEST_LOG):].strip())
        elif DEVICES in line and "echo" not in line and "sed" not in line:
            self._device(line[line.index(DEVICES) + len(DEVICES):].strip(), now)
        if self.late and self.late in line and "echo" not in line:
            self._late(line[line.index(self.late):], now)
        elif self.late_line and self.late_failed and "late end" not in self.seen:
            self.late_report.append(line)

    def _device(self, text: str, now: float) -> None:
        """The watcher's lines: a device as it is now, or ``gone`` and the line it printed before."""
        if text.startswith("gone "):
            self.devices.pop(text.removeprefix("gone "), None)
        elif text:
            self.devices.setdefault(text, now)

    def _late(self, line: str, now: float) -> None:
        word = line.removeprefix(str(self.late)).split()[:1]
        if word == ["ok"] and self.late_line is None:
            self.late_line = line
            self._note("late read", now)
        elif word and word[0].startswith("failed") and self.late_line is None:
            self.late_line = line
        elif word == ["end"] and self.late_failed:
            self._note("late end", now)

    @property
    def late_failed(self) -> bool:
        """Whether the guest said it could not read its metadata late."""
        return self.late_line is not None and "late read" not in self.seen

    @property
    def late_reported(self) -> bool:
        """Whether a failed late read has printed all it prints (its routes, then the end line)."""
        return self.late_failed and "late end" in self.seen

    def finished_with(self, datasource: str) -> bool:
        """Whether cloud-init finished with ``datasource`` (a prefix: DataSourceNoCloud covers NoCloudNet)."""
        return self.datasource is not None and self.datasource.startswith(datasource)

    def done(self, datasource: str) -> bool:
        """Everything a passing boot shows: the datasource, the marker, the hostname (and the install's end)."""
        shown = self.finished_with(datasource) and "marker" in self.seen and "hostname" in self.seen
        late = self.late is None or "late read" in self.seen
        return shown and late and self.devices_shown() and (self.install is None or "ganeti install" in self.seen)

    def devices_shown(self) -> bool:
        """Whether every expected device line is on the console now."""
        return all(any(line.startswith(start) and part in line for line in self.devices)
                   for start, part in self.expect_devices)

    def text(self) -> str:
        """The whole log so far (for messages)."""
        return self.path.read_text(errors="replace") if self.path.exists() else ""
