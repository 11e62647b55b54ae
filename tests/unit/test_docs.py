"""The docs name every option the code has, and nothing it does not."""

from __future__ import annotations

import re
from pathlib import Path

from imds.config import OPTIONS

README = Path(__file__).parents[2] / "README.md"


def _table_rows() -> dict[str, str]:
    rows = {}
    for line in README.read_text().splitlines():
        match = re.match(r"^\| `(--[a-z0-9-]+)[^`]*` \| `(IMDS_[A-Z0-9_]+)` \|", line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


def test_readme_configuration_table_matches_the_option_table():
    """Each option appears in the README table with its flag and environment variable, and no others."""
    expected = {option.flag: option.env for option in OPTIONS}
    assert _table_rows() == expected


def test_readme_has_exactly_two_setup_commands():
    """The setup section holds two commands: serve and test."""
    setup = README.read_text().split("## Setup", 1)[1].split("##", 1)[0]
    block = setup.split("```sh", 1)[1].split("```", 1)[0]
    commands = [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands == ["IMDS_ADMIN_TOKEN=dev-token bash scripts/serve --demo", "bash scripts/test"]
