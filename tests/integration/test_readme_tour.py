"""The README's commands, literally as written, against ``scripts/serve`` (so the README cannot drift).

The server is command 1 of the README's setup (``IMDS_ADMIN_TOKEN=dev-token bash scripts/serve
--demo``) with HOME in the test's tmp dir; the only change to the commands is the port (8000
becomes a free one, on 127.0.0.1 and [::1]), so the test never collides with a server someone
runs by hand. Every shell block of the sections below runs in order in one bash session, in a
directory where ``.venv`` and ``src`` are this checkout's (the README's commands are run from
the checkout). ``curl`` is wrapped to fail on HTTP errors and record them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from serve_process import START_TIMEOUT, Server, clean_env, free_port

ROOT = Path(__file__).parents[2]
SECTIONS = (
    "## A short tour",
    "### The EC2 flavor",
    "### The OpenStack flavor",
    "### The NoCloud flavor",
    "### Config drives (and NoCloud seeds)",
    "### Records from the command line",
)
PRELUDE = """set -eu
curl() {
  case "$*" in  # the link-local address is never a target from the host
    *169.254.169.254*) echo "curl $*: refused (link-local from the host)" >> "$TOUR_ERRORS"; return 22;;
  esac
  command curl --fail-with-body "$@" || { echo "curl $*: exit $?" >> "$TOUR_ERRORS"; return 22; }
}
"""


def readme_blocks(section: str) -> list[str]:
    """The ```sh blocks of one README section, up to the next heading (its subsections are not walked)."""
    blocks: list[str] = []
    inside = in_code = in_sh = False
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
            in_sh = inside and in_code and line == "```sh"
            if in_sh:
                blocks.append("")
            continue
        if not in_code and line.startswith("#"):
            if line == section:
                inside = True
            elif inside:
                break  # a section's blocks end at the next heading of any level
            continue
        if in_sh:
            blocks[-1] += line + "\n"
    return blocks


def test_readme_sections_have_commands():
    """Every section the tour walks has at least one shell block (a renamed heading must fail here)."""
    for section in SECTIONS:
        assert readme_blocks(section), section


@pytest.mark.timeout(600)
def test_the_readme_walk_works_as_written(tmp_path):
    """Setup command 1, then every command of the tour, EC2, OpenStack, NoCloud, config drive and records sections."""
    assert shutil.which("openssl"), "openssl is needed by the EC2 section (scripts/test installs it)"
    port = free_port()
    home = tmp_path / "home"
    env = {**clean_env(tmp_path, IMDS_ADMIN_TOKEN="dev-token"), "HOME": str(home)}
    env.pop("XDG_DATA_HOME")
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            ["bash", "scripts/serve", "--demo", "--listen", f"127.0.0.1:{port}", "--listen", f"[::1]:{port}"],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(process, f"http://127.0.0.1:{port}", log)
    try:
        server.wait_healthy()
        work = tmp_path / "checkout"
        work.mkdir()
        (work / ".venv").symlink_to(ROOT / ".venv")
        (work / "src").symlink_to(ROOT / "src")
        script = PRELUDE + "\n".join(block for section in SECTIONS for block in readme_blocks(section))
        script = script.replace("127.0.0.1:8000", f"127.0.0.1:{port}").replace("[::1]:8000", f"[::1]:{port}")
        errors = tmp_path / "errors.log"
        tour_env = {**clean_env(tmp_path), "HOME": str(home), "TOUR_ERRORS": str(errors)}
        tour_env.pop("XDG_DATA_HOME")
        ran = subprocess.run(["bash", "-c", script], cwd=work, env=tour_env, capture_output=True, text=True,
                             timeout=300, check=False)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # scripts/serve execs imds: the group is that one process
            process.wait(timeout=START_TIMEOUT)
    failed = errors.read_text() if errors.exists() else ""
    assert (ran.returncode, failed) == (0, ""), f"{ran.stdout[-3000:]}\n{ran.stderr[-3000:]}\n{failed}"
    out = ran.stdout
    assert '"applied":true' in out
    assert "label config-2" in out  # imds configdrive list
    assert "web-1" in out  # imds list / get
    assert "0 created, 0 updated" in out  # the dry-run import of what was just exported changes nothing
    assert (work / "config-2.iso").is_file()
    assert (work / "seed.iso").is_file()
