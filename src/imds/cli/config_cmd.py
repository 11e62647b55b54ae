"""``imds config show``: the effective configuration, secrets masked, and where each value came from.

Sources, highest first: ``flag``, ``env`` (``IMDS_*``), ``file`` (the TOML file named by
``--config`` / ``IMDS_CONFIG``; keys are the option names listed here), ``default``.
"""

from __future__ import annotations

import json
from typing import Any

import click

from imds.cli.options import settings_options
from imds.config import effective
from imds.errors import ConfigError


@click.group(name="config")
def config() -> None:
    """Inspect the configuration (flags > environment > --config file > defaults)."""


@config.command()
@settings_options()
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="table, or json ([{name, value, source}]).")
def show(output: str, **flags: Any) -> None:
    """Print every setting as imds serve would resolve it, secrets masked, with its source.

    Sources, highest first: flag, env, file (--config / IMDS_CONFIG), default.

    Example: imds config show --config /etc/imds/imds.toml -o json
    """
    try:
        rows = effective(flags)
    except ConfigError as exc:
        raise click.UsageError(exc.message) from exc
    if output == "json":
        click.echo(json.dumps([{"name": n, "value": v, "source": s} for n, v, s in rows], indent=2))
        return
    width = max(len(name) for name, _value, _source in rows)
    for name, value, source in rows:
        click.echo(f"{name:<{width}}  {source:<7}  {value}")
