"""The docs name every option the code has, and nothing it does not."""

from __future__ import annotations

import re
from pathlib import Path

from imds.config import OPTIONS, options_table

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"


def test_configuration_table_is_the_generated_one():
    """docs/configuration.md's table is exactly options_table(): every option, its flag, env var, default and help."""
    text = CONFIGURATION.read_text()
    start = text.index("| flag | environment |")
    table = text[start : text.index("\n\n", start)]
    assert table == options_table(), "regenerate: python -c 'from imds.config import options_table; ...'"


def test_generated_table_has_one_row_per_option():
    """The generator itself lists each option once with its flag and environment variable."""
    rows = options_table().splitlines()[2:]
    assert len(rows) == len(OPTIONS)
    for option, row in zip(OPTIONS, rows, strict=True):
        assert f"`{option.flag}" in row
        assert f"`{option.env}`" in row


def test_readme_has_exactly_two_setup_commands():
    """The setup section holds two commands: serve and test."""
    setup = README.read_text().split("## Setup", 1)[1].split("##", 1)[0]
    block = setup.split("```sh", 1)[1].split("```", 1)[0]
    commands = [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands == ["IMDS_ADMIN_TOKEN=dev-token bash scripts/serve --demo", "bash scripts/test"]


def _shell_lines(path: Path) -> list[str]:
    """The commands of ``path``'s ```sh blocks, continuation lines joined, comments dropped."""
    blocks = re.findall(r"```sh\n(.*?)```", path.read_text(), re.DOTALL)
    lines = [line.strip() for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_no_walk_listens_on_the_port_setup_command_1_holds():
    """The README's command 1 holds 127.0.0.1:8000 and [::1]:8000 while docs/ are walked: no block listens there.

    A server a walk starts in the background names its --listen (the default is 8000 too).
    """
    for path in sorted((ROOT / "docs").glob("*.md")):
        for line in _shell_lines(path):
            binds = re.findall(r"--(?:admin-)?listen[= ]['\"]?([^'\"\s]+)", line)
            assert not [bind for bind in binds if bind.rsplit(":", 1)[-1] == "8000"], (path.name, line)
            if re.search(r"\bimds serve\b", line) and line.endswith("&"):
                assert re.search(r"--listen[= ]", line), (path.name, line)


def test_readme_names_the_system_users_and_groups_command_2_creates():
    """scripts/ganeti.sh adds system users and groups to the machine: the README names each one it creates."""
    script = (ROOT / "scripts" / "ganeti.sh").read_text()
    loops = dict(re.findall(r"for (group|user) in ([^;]+); do", script))
    assert set(loops) == {"group", "user"}, "scripts/ganeti.sh no longer reads as the README describes it"
    setup = README.read_text().split("## Setup", 1)[1].split("\n## ", 1)[0]
    for kind, names in loops.items():
        for name in names.split():
            assert f"`{name}`" in setup, (kind, name)
