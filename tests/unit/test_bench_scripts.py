"""The benchmarks still run against the current code (they are never run in CI otherwise).

Every script answers ``--help``; ``front_cost.py``, which builds the application the way
``imds serve`` does, runs a tiny measurement into a scratch file, so a change to the app's
construction (settings, services) that a benchmark was not updated for fails here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SCRIPTS = sorted(p for p in (ROOT / "bench").glob("*.py") if p.name != "benchlib.py")


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_every_benchmark_answers_help(script: Path) -> None:
    """``--help`` exits 0 and prints the script's usage (its imports and argument parser are sound)."""
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120,
                          check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:")


def test_front_cost_measures_the_current_app(tmp_path: Path) -> None:
    """A tiny in-process run prints a figure per path and writes its table to the given file only."""
    output = tmp_path / "results.md"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "front_cost.py"), "--count", "200", "--repeat", "1",
         "--output", str(output)],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table = output.read_text()
    for path in ("/metadata", "/latest/meta-data/instance-id", "/openstack/latest/meta_data.json"):
        assert f"| `{path}` | 200 |" in table, table  # answered by the app, not an error page
