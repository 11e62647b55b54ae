"""``imds agent``: the distributed metadata datapath on one hypervisor (OVS flows + one haproxy)."""

from __future__ import annotations

import signal
from typing import Any

import click

from imds import log
from imds.cli.options import resolve_command, settings_options
from imds.config import AGENT, AGENT_OPTIONS
from imds.errors import ConfigError, ImdsError
from imds.signing import read_secret


def _stop(_signum: int, _frame: object) -> None:
    """SIGTERM unwinds run(), which stops haproxy and the OVSDB monitor it started."""
    raise SystemExit(0)


@click.command()
@settings_options(table=AGENT_OPTIONS)
def agent(**flags: Any) -> None:
    """Give each VM port a Meta IP/MAC, program br-int/br-meta and serve them through one haproxy."""
    from imds.agent.loop import Agent  # noqa: PLC0415 - loads only when the agent runs

    settings = resolve_command(AGENT, flags)
    try:
        secret = read_secret(settings.shared_secret_file, "--shared-secret-file")
        runner = Agent(settings, secret)
    except ConfigError as exc:
        raise click.UsageError(exc.message) from exc
    log.configure(settings.log_level)
    signal.signal(signal.SIGTERM, _stop)
    logger = log.get("agent")
    logger.info("agent.starting", mode=settings.mode, integration_bridge=settings.integration_bridge,
                metadata_bridge=settings.metadata_bridge, provider_cidr=settings.provider_cidr)
    try:
        runner.run()
    except ImdsError as exc:
        logger.error("agent.failed", error=exc.message)  # noqa: TRY400 - the message says it all
        raise SystemExit(1) from exc
    except KeyboardInterrupt:
        pass
