"""Fixtures for ``imds guest`` tests: fake machines in tmp_path, in-process runs, a fake udevadm."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from guest_machines import FakeUdevadm, write_script

from imds.guest.cli import main
from imds.guest.testing import FakeSystem


@pytest.fixture(scope="session")
def guard_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory whose udevadm, mount and umount fail loudly."""
    guard = tmp_path_factory.mktemp("guard-bin")
    for name in ("udevadm", "mount", "umount"):
        write_script(guard / name, f'echo "the real {name} must not run in tests" >&2\nexit 99')
    return guard


@pytest.fixture(autouse=True)
def no_real_system_tools(guard_bin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard directory comes first on PATH: tests must pass their own fake udevadm and mount."""
    monkeypatch.setenv("PATH", f"{guard_bin}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.fixture
def fake(tmp_path: Path) -> FakeSystem:
    """An empty fake machine under tmp_path/machine."""
    return FakeSystem(tmp_path / "machine")


@dataclass
class Run:
    """The outcome of one ``main()`` call."""

    status: int
    out: str
    err: str


@pytest.fixture
def run_udev(capsys: pytest.CaptureFixture[str]):
    """Run ``udev`` in-process against a fake machine; returns a ``Run``."""

    def run(fake: FakeSystem, *args: str) -> Run:
        status = main(["udev", "--sysfs-root", str(fake.sys), "--dev-root", str(fake.dev), *args], prog="imds-guest")
        captured = capsys.readouterr()
        return Run(status, captured.out, captured.err)

    return run


@pytest.fixture
def udevadm(tmp_path: Path) -> FakeUdevadm:
    """A fake udevadm in tmp_path that records calls and succeeds."""
    log = tmp_path / "udevadm.log"
    return FakeUdevadm(write_script(tmp_path / "udevadm", f'echo "$*" >> "{log}"'), log)
