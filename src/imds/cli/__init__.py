"""The ``imds`` command. Settings load only when a command runs."""

from __future__ import annotations

import click

from imds import __version__
from imds.cli import export, records, transfer
from imds.cli.agent import agent
from imds.cli.config_cmd import config
from imds.cli.configdrive import configdrive
from imds.cli.db import db
from imds.cli.events import events
from imds.cli.explain import explain
from imds.cli.hostkey import host_key_command
from imds.cli.lab import lab
from imds.cli.proxy import proxy
from imds.cli.serve import serve


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="imds", message="%(prog)s %(version)s")
def cli() -> None:
    """imds: instance metadata service."""


@cli.command()
def version() -> None:
    """Print the imds version."""
    click.echo(__version__)


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False}, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def guest(args: tuple[str, ...]) -> None:
    """In-guest tools: udev rules from role tags; Ganeti OS install."""
    from imds.guest.cli import main as guest_main  # noqa: PLC0415 - argparse, stdlib only; loads when used

    raise SystemExit(guest_main(list(args), prog="imds guest"))


cli.add_command(serve)
cli.add_command(db)
cli.add_command(configdrive)
cli.add_command(records.get)
cli.add_command(records.list_)
cli.add_command(records.delete)
cli.add_command(transfer.import_)
cli.add_command(export.export)
cli.add_command(agent)
cli.add_command(proxy)
cli.add_command(host_key_command)  # imds host-key HOST
cli.add_command(events)
cli.add_command(explain)  # imds explain IP|ID
cli.add_command(config)  # imds config show
cli.add_command(lab)  # imds lab image build | boot


def main() -> None:
    """Console-script entry point."""
    cli()
