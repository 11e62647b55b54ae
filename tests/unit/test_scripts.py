"""scripts/: root only when something is missing, and pinned gate tools."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]
GATES = ("ruff", "mypy", "pytest", "pytest-timeout", "types-jsonschema", "types-pyyaml")


def _as_nobody(script: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run ``script`` in scripts/'s shell as an unprivileged user with a ``sudo`` that only logs its calls."""
    with tempfile.TemporaryDirectory(prefix="imds-test-scripts-") as scratch:  # pytest's tmp_path is root-only
        tmp_path = Path(scratch)
        tmp_path.chmod(0o777)
        return _run_as_nobody(script, tmp_path)


def _run_as_nobody(script: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    log = tmp_path / "sudo.log"
    fake = tmp_path / "bin" / "sudo"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    fake.chmod(0o755)
    path = f"PATH={fake.parent}:{os.environ['PATH']}"
    done = subprocess.run(
        ["runuser", "-u", "nobody", "--", "env", path, f"HOME={tmp_path}", "bash", "-euo", "pipefail", "-c", script],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    return done, (log.read_text().splitlines() if log.exists() else [])


def test_apt_ensure_uses_no_sudo_when_everything_is_installed():
    """Installed packages (bash, and the cloud-init guard file) need no root: sudo is never called."""
    script = (ROOT / "scripts" / "test").read_text()
    guard = re.search(r"^\[ -e /etc/cloud/cloud-init.disabled \].*$", script, re.MULTILINE)
    assert guard is not None, "scripts/test must check the guard file before asking for root"
    assert Path("/etc/cloud/cloud-init.disabled").exists()
    done, calls = _as_nobody(f". scripts/lib.sh; apt_ensure bash coreutils; {guard.group(0)}")
    assert done.returncode == 0, done.stderr
    assert calls == []


def test_apt_ensure_asks_for_root_for_a_missing_package():
    """A package that is not installed goes through sudo apt-get (here a fake sudo that installs nothing)."""
    done, calls = _as_nobody(". scripts/lib.sh; apt_ensure imds-no-such-package")
    assert done.returncode == 0, done.stderr
    assert calls[0] == "apt-get update -qq"
    assert calls[1].endswith("install -y -qq --no-install-recommends imds-no-such-package")


def test_gate_tools_are_pinned_exactly():
    """ruff/mypy/pytest and the stubs are == pins, so a new release cannot turn a fresh clone red."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    pins = {re.split(r"[=<>~!\[ ]", spec, maxsplit=1)[0].lower(): spec for spec in extra}
    for tool in GATES:
        assert re.fullmatch(rf"{re.escape(tool)}==[0-9][0-9a-z.]*", pins[tool], re.IGNORECASE), pins.get(tool)

FAKE_PYTHON3 = """#!/bin/sh
# python3 for scripts/serve's install step: "-m venv DIR" makes a venv whose python logs each
# call (pip's included, and never reaching a network) and whose imds says how it was run.
[ "$1" = "-c" ] && exit 0
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin"
  printf '#!/bin/sh\\necho "python $*" >> "$CALLS"\\n' > "$3/bin/python"
  printf '#!/bin/sh\\necho "imds $*" >> "$CALLS"\\n' > "$3/bin/imds"
  chmod +x "$3/bin/python" "$3/bin/imds"
  exit 0
fi
echo "unexpected python3 $*" >&2
exit 3
"""


def test_serve_installs_once_then_starts_without_pip(tmp_path):
    """scripts/serve installs when .venv is missing or pyproject.toml changed, never on a plain restart."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    for name in ("serve", "lib.sh"):
        shutil.copy(ROOT / "scripts" / name, checkout / "scripts" / name)
    shutil.copy(ROOT / "pyproject.toml", checkout / "pyproject.toml")
    shim = tmp_path / "bin" / "python3"
    shim.parent.mkdir()
    shim.write_text(FAKE_PYTHON3)
    shim.chmod(0o755)
    calls = tmp_path / "calls.log"
    env = {"PATH": f"{shim.parent}:/usr/bin:/bin", "HOME": str(tmp_path), "CALLS": str(calls)}

    def serve(*args: str, status: int = 0) -> list[str]:
        before = calls.read_text().splitlines() if calls.exists() else []
        done = subprocess.run(["bash", "scripts/serve", *args], cwd=checkout, env=env, capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == status, done.stderr
        if status:
            assert done.stderr.startswith("scripts/serve: --port takes a port number"), done.stderr
        return calls.read_text().splitlines()[len(before):]

    pip = "python -m pip install -q --disable-pip-version-check -e ."
    assert serve("--demo") == [pip, "imds serve --demo"]
    assert serve("--demo") == ["imds serve --demo"]  # the restart: no pip, so no network needed
    assert serve() == ["imds serve"]
    with (checkout / "pyproject.toml").open("a") as file:
        file.write("\n# a changed pyproject.toml\n")
    assert serve() == [pip, "imds serve"]
    assert serve() == ["imds serve"]
    shutil.rmtree(checkout / ".venv")
    assert serve() == [pip, "imds serve"]
    # --port N: the default's two loopback addresses on another port; everything else passes through as given.
    ports = "--listen 127.0.0.1:8002 --listen [::1]:8002"
    assert serve("--demo", "--port", "8002") == [f"imds serve --demo {ports}"]
    assert serve("--port=8002", "--log-level", "debug") == [f"imds serve {ports} --log-level debug"]
    assert serve("--listen", "127.0.0.5:9000", "--db", "memory://") == ["imds serve --listen 127.0.0.5:9000 --db memory://"]
    for bad in (("--port",), ("--port", "http"), ("--port=0",), ("--port", "70000")):
        assert serve("--demo", *bad, status=2) == []  # refused before imds starts
