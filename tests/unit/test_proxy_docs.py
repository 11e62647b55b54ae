"""docs/hypervisor.md's ``imds proxy`` section lists exactly the proxy's options."""

from __future__ import annotations

from pathlib import Path

from imds.config import PROXY_OPTIONS, options_table

HYPERVISOR = Path(__file__).parents[2] / "docs" / "hypervisor.md"


def test_proxy_table_is_the_generated_one():
    """Regenerate with ``options_table(PROXY_OPTIONS)`` from ``imds.config``."""
    section = HYPERVISOR.read_text().split("## `imds proxy`: a signing proxy", 1)[1]
    start = section.index("| flag | environment |")
    assert section[start : section.index("\n\n", start)] == options_table(PROXY_OPTIONS)
