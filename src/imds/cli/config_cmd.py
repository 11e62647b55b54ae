"""``imds config show`` (and ``show-proxy``, ``show-agent``): the effective configuration, secrets masked, with sources.

Sources, highest first: ``flag``, ``env`` (``IMDS_*``), ``file`` (the TOML file named by
``--config`` / ``IMDS_CONFIG``; keys are the option names listed here), ``default``. One
subcommand per long-running command in ``imds.config.COMMANDS``, with that command's flags.
"""

from __future__ import annotations

import json
from typing import Any

import click

from imds.cli.options import settings_options
from imds.config import COMMANDS, SERVE, Command, effective
from imds.errors import ConfigError


@click.group(name="config")
def config() -> None:
    """Inspect the configuration (flags > environment > --config file > defaults)."""


def _show(command: Command[Any]) -> click.Command:
    """The ``show`` subcommand for ``command``: its flags, ``--config`` and ``-o``."""

    @settings_options(table=command.table, hollow=command is SERVE)
    @click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True,
                  help="table, or json ([{name, value, source}]).")
    def show(output: str, **flags: Any) -> None:
        try:
            rows = effective(flags, command=command.name)
        except ConfigError as exc:
            raise click.UsageError(exc.message) from exc
        if output == "json":
            click.echo(json.dumps([{"name": n, "value": v, "source": s} for n, v, s in rows], indent=2))
            return
        width = max(len(name) for name, _value, _source in rows)
        for name, value, source in rows:
            click.echo(f"{name:<{width}}  {source:<7}  {value}")

    name = "show" if command.name == "serve" else f"show-{command.name}"
    show.__doc__ = (
        f"Print every setting as imds {command.name} would resolve it, secrets masked, with its source.\n\n"
        "Sources, highest first: flag, env, file (--config / IMDS_CONFIG), default.\n\n"
        f"Example: imds config {name} --config /etc/imds/imds.toml -o json"
    )
    return click.command(name)(show)


for _command in COMMANDS.values():
    config.add_command(_show(_command))
