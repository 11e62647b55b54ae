"""``imds host-key``: derive one host's signing key from the fleet secret (``imds.signing.host_key``).

Run where the fleet secret is (beside ``imds serve``), never on the host: the host gets its
own key only, so a captured host signs for the instances on it alone. Usage::

    imds host-key --fleet-secret-file /etc/imds/fleet.secret compute-7 -o compute-7.key
    # then on compute-7: /etc/imds/host.key (mode 0600), imds agent --host-key-file ... --host-name compute-7
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from imds.errors import ConfigError
from imds.signing import host_key, read_secret, valid_host


@click.command("host-key")
@click.option("--fleet-secret-file", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="The fleet secret imds serve holds (--proxy-fleet-secret-file).")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False),
              help="Write the key to this file (created mode 0600; must not exist) instead of stdout.")
@click.argument("host")
def host_key_command(fleet_secret_file: Path, output: Path | None, host: str) -> None:
    """Print HOST's signing key (hex), derived from the fleet secret: install it on HOST alone."""
    if not valid_host(host):
        raise click.BadParameter("letters, digits, '.', '_' and '-' only (253 at most)", param_hint="HOST")
    try:
        secret = read_secret(fleet_secret_file, "--fleet-secret-file")
    except ConfigError as exc:
        raise click.UsageError(exc.message) from exc
    key = host_key(secret, host) + b"\n"
    if output is None:
        click.echo(key.decode(), nl=False)
        return
    try:
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise click.UsageError(f"--output: cannot create {output}: {exc.strerror}") from exc
    with os.fdopen(fd, "wb") as handle:
        handle.write(key)
