"""The README's ``imds proxy`` section lists exactly the proxy's options."""

from __future__ import annotations

from pathlib import Path

from imds.config import PROXY_OPTIONS, options_table

README = Path(__file__).parents[2] / "README.md"


def test_readme_proxy_table_is_the_generated_one():
    """Regenerate with ``options_table(PROXY_OPTIONS)`` from ``imds.config``."""
    section = README.read_text().split("## On a hypervisor: `imds proxy`", 1)[1]
    start = section.index("| flag | environment |")
    assert section[start : section.index("\n\n", start)] == options_table(PROXY_OPTIONS)
