"""Every command declares each option once, checked in-process (a subprocess would miss click's warnings)."""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from imds.cli import cli


def commands(group: click.Group = cli, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """(path, command) of every command under ``group``, subcommands included."""
    for name, command in sorted(group.commands.items()):
        path = (*prefix, name)
        yield path, command
        if isinstance(command, click.Group):
            yield from commands(command, path)


COMMANDS = list(commands())


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(path) for path, _ in COMMANDS])
def test_no_command_declares_an_option_twice(path, command):
    """No two parameters share a name or a flag (click then warns on every run and lists the flag twice)."""
    names = Counter(param.name for param in command.params)
    flags = Counter(flag for param in command.params for flag in (*param.opts, *param.secondary_opts))
    assert [name for name, count in names.items() if count > 1] == [], path
    assert [flag for flag, count in flags.items() if count > 1] == [], path


def test_import_help_warns_nothing_and_lists_config_once():
    """``imds import --help`` runs without a click warning and shows ``--config`` once."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = CliRunner().invoke(cli, ["import", "--help"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.output.count("--config PATH") == 1
    assert "UserWarning" not in result.output


def test_import_help_says_what_happens_to_malformed_json():
    """The help tells apart a source that cannot be read (nothing written) from an item that is not valid JSON."""
    result = CliRunner().invoke(cli, ["import", "--help"], catch_exceptions=False)
    text = " ".join(result.output.split())
    assert "nothing is written" in text
    assert "A line that is not valid JSON is rejected" in text
    assert "--strict" in text
    assert "--partial" in text
