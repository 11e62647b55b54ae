"""The ``imds`` command. Settings load only when a command runs."""

from __future__ import annotations

import click

from imds import __version__
from imds.cli.db import db
from imds.cli.serve import serve


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """imds: instance metadata service."""


@cli.command()
def version() -> None:
    """Print the imds version."""
    click.echo(__version__)


cli.add_command(serve)
cli.add_command(db)


def main() -> None:
    """Console-script entry point."""
    cli()
