"""The README's tour, and the walks of docs/, literally as written, against ``scripts/serve``.

The commands are read from the Markdown files' ```sh blocks, so the docs cannot drift. The
server is command 1 of the README's setup (``IMDS_ADMIN_TOKEN=dev-token bash scripts/serve
--demo``) with HOME in the test's tmp dir; the only change to the commands is the port (8000
becomes a free one, on 127.0.0.1 and [::1], given as the README says: ``--port N``), so the test
never collides with a server someone runs by hand. The commands run in a directory where
``.venv`` and ``src`` are this checkout's (they are run from the checkout). ``curl`` is
wrapped to fail on HTTP errors and record them.

The README's tour runs block by block, as a reader runs it in several terminals: its change
watch (the block with ``wait_for_change``) runs in the background, and the next block (the
write that ends it) starts only once the server reports the read as held. Then the walks of
docs/ (admin API, EC2, OpenStack, NoCloud, config drives, records from the command line) run
in order in one bash session.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import wait_for
from serve_process import START_TIMEOUT, Server, clean_env, free_port, metric

ROOT = Path(__file__).parents[2]
TOUR = ("README.md", "## A short tour")
WALKS = (
    ("docs/admin-api.md", "## A walk through the admin API"),
    ("docs/flavors.md", "## The EC2 flavor"),
    ("docs/flavors.md", "## The OpenStack flavor"),
    ("docs/flavors.md", "## The NoCloud flavor"),
    ("docs/flavors.md", "## Config drives (and NoCloud seeds)"),
    ("docs/operations.md", "## Records from the command line"),
)
TOUR_ID = "7d0ab2bc-3a53-4d5e-8f44-2b2b9c1f6a10"
HELD_TIMEOUT = 30.0  # seconds for the held read to be seen, and to answer once the record changed
PRELUDE = """set -eu
curl() {
  case "$*" in  # the link-local address is never a target from the host
    *169.254.169.254*) echo "curl $*: refused (link-local from the host)" >> "$TOUR_ERRORS"; return 22;;
  esac
  command curl --fail-with-body "$@" || { echo "curl $*: exit $?" >> "$TOUR_ERRORS"; return 22; }
}
"""


def doc_blocks(path: str, section: str) -> list[str]:
    """The ```sh blocks of one section of a Markdown file, up to the next heading (subsections are not walked)."""
    blocks: list[str] = []
    inside = in_code = in_sh = False
    for line in (ROOT / path).read_text().splitlines():
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


def test_tour_and_walks_have_commands():
    """Every section walked has a shell block (a renamed heading fails here); the tour watches for a change."""
    for path, section in (TOUR, *WALKS):
        assert doc_blocks(path, section), (path, section)
    tour = doc_blocks(*TOUR)
    watches = [i for i, block in enumerate(tour) if "wait_for_change" in block]
    assert len(watches) == 1, tour
    assert watches[0] < len(tour) - 1, "the write that ends the wait follows the watch"
    assert any("imds explain" in block for block in tour)


class Walk:
    """Runs blocks of commands in bash, from ``work``, against the test's server."""

    def __init__(self, work: Path, env: dict[str, str], port: int) -> None:
        self.work, self.env, self.port = work, env, port

    def script(self, *blocks: str) -> str:
        """The blocks after the prelude, with the README's port replaced by the test's."""
        text = PRELUDE + "\n".join(blocks)
        return text.replace("127.0.0.1:8000", f"127.0.0.1:{self.port}").replace("[::1]:8000", f"[::1]:{self.port}")

    def run(self, *blocks: str) -> subprocess.CompletedProcess[str]:
        """Run the blocks to completion (bounded)."""
        return subprocess.run(["bash", "-c", self.script(*blocks)], cwd=self.work, env=self.env,
                              capture_output=True, text=True, timeout=300, check=False)

    def start(self, block: str) -> subprocess.Popen[str]:
        """Start a block in the background (another terminal), output captured."""
        return subprocess.Popen(["bash", "-c", self.script(block)], cwd=self.work, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_tour(walk: Walk, server: Server) -> tuple[str, str, str]:
    """The README tour, block by block; returns (output of the other blocks, the watch's output, explain's)."""
    output, watched, explained = "", "", ""
    waiting: subprocess.Popen[str] | None = None
    for block in doc_blocks(*TOUR):
        if "wait_for_change" in block:
            waiting = walk.start(block)

            def held(watch: subprocess.Popen[str] = waiting) -> bool:
                assert watch.poll() is None, f"the watch returned without waiting: {watch.communicate()}"
                return metric(server, "imds_watch_waiting") >= 1

            wait_for(held, what="the watch's read to be held by the server", timeout=HELD_TIMEOUT)
            assert waiting.poll() is None, "the watch must still be waiting before the record changes"
            continue
        ran = walk.run(block)
        assert ran.returncode == 0, f"{block}\n{ran.stdout[-3000:]}\n{ran.stderr[-3000:]}"
        if "imds explain" in block:
            explained = ran.stdout
            assert ran.stderr == "", ran.stderr  # the answer only: no log line (httpx's request line was one)
        else:
            output += ran.stdout
        if waiting is not None:  # this block is the write that ends the wait
            started = time.monotonic()
            out, err = waiting.communicate(timeout=HELD_TIMEOUT)
            assert waiting.returncode == 0, f"{out}\n{err}"
            assert time.monotonic() - started < HELD_TIMEOUT, "the watch answered at its timeout, not on the change"
            watched, waiting = out, None
    assert waiting is None, "no block after the watch changed the record"
    return output, watched, explained


@pytest.mark.timeout(600)
def test_the_tour_and_the_walks_work_as_written(tmp_path):
    """Setup command 1, the README's tour (a change watch woken by a write), then the walks of docs/."""
    assert shutil.which("openssl"), "openssl is needed by the EC2 section (scripts/test installs it)"
    port = free_port()
    home = tmp_path / "home"
    env = {**clean_env(tmp_path, IMDS_ADMIN_TOKEN="dev-token"), "HOME": str(home)}
    env.pop("XDG_DATA_HOME")
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            ["bash", "scripts/serve", "--demo", "--port", str(port)],  # the README's answer to a busy port 8000
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(process, f"http://127.0.0.1:{port}", log)
    server.admin_headers = {"Authorization": "Bearer dev-token"}
    errors = tmp_path / "errors.log"
    try:
        server.wait_healthy()
        work = tmp_path / "checkout"
        work.mkdir()
        (work / ".venv").symlink_to(ROOT / ".venv")
        (work / "src").symlink_to(ROOT / "src")
        tour_env = {**clean_env(tmp_path), "HOME": str(home), "TOUR_ERRORS": str(errors)}
        tour_env.pop("XDG_DATA_HOME")
        walk = Walk(work, tour_env, port)
        toured, watched, explained = run_tour(walk, server)
        ran = walk.run(*(block for path, section in WALKS for block in doc_blocks(path, section)))
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # scripts/serve execs imds: the group is that one process
            process.wait(timeout=START_TIMEOUT)
    failed = errors.read_text() if errors.exists() else ""
    assert failed == "", failed
    # The tour: the push applied, the instance at 127.0.0.2 reads it, in three flavors.
    assert '"applied":true' in toured
    assert '"hostname":"web-1"' in toured  # /metadata as 127.0.0.2
    assert "da11" in toured  # EC2: the document's facility is the availability zone
    assert f'"uuid":"{TOUR_ID}"' in toured.replace(" ", "")  # OpenStack meta_data.json
    # The watch waited (checked above), then answered the new document, not the old one.
    assert '"hostname":"web-2"' in watched, watched
    assert "web-1" not in watched
    # explain names the instance and the entry the address matched.
    assert TOUR_ID in explained, explained
    assert "127.0.0.2" in explained
    # The walks of docs/.
    assert ran.returncode == 0, f"{ran.stdout[-3000:]}\n{ran.stderr[-3000:]}"
    out = ran.stdout
    assert '"applied":true' in out
    assert "label config-2" in out  # imds configdrive list
    assert "web-1" in out  # imds list / get
    assert "0 created, 0 updated" in out  # the dry-run import of what was just exported changes nothing
    assert (work / "config-2.iso").is_file()
    assert (work / "seed.iso").is_file()
