"""``imds agent``: the distributed metadata datapath on one hypervisor (OVS flows + one haproxy)."""

from __future__ import annotations

import ipaddress
import signal
from typing import Any
from urllib.parse import urlsplit

import click

from imds import log
from imds.cli.options import resolve_command, settings_options
from imds.config import AGENT, AGENT_OPTIONS, AgentSettings
from imds.errors import ConfigError, ImdsError
from imds.signing import signing_key


def _warn(settings: AgentSettings, host: str | None) -> None:
    """Say once what is weaker than it could be: one secret for the fleet, an unverified upstream."""
    logger = log.get("agent")
    if host is None:
        logger.warning("agent.shared_secret", mode="one secret for every host",
                       advice="sign with this host's own key: --host-key-file and --host-name")
    if settings.upstream_insecure:
        logger.warning("agent.upstream_insecure", upstream=settings.upstream,
                       reason="--upstream-insecure: the upstream's certificate is not verified")
    elif settings.upstream.lower().startswith("https://") and _is_address(settings.upstream):
        logger.warning("agent.upstream_name_unchecked", upstream=settings.upstream,
                       reason="haproxy checks an address upstream's certificate chain, not its name: use a DNS name")


def _is_address(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _stop(_signum: int, _frame: object) -> None:
    """SIGTERM unwinds run(), which stops haproxy and the OVSDB monitor it started."""
    raise SystemExit(0)


@click.command()
@settings_options(table=AGENT_OPTIONS)
def agent(**flags: Any) -> None:
    """Give each VM port a Meta IP/MAC, program br-int/br-meta and serve them through one haproxy."""
    from imds.agent.loop import Agent  # noqa: PLC0415 - loads only when the agent runs

    settings = resolve_command(AGENT, flags)
    log.configure(settings.log_level)
    try:
        key = signing_key(shared_secret_file=settings.shared_secret_file, host_key_file=settings.host_key_file,
                          host_name=settings.host_name)
        runner = Agent(settings, key)
    except ConfigError as exc:
        raise click.UsageError(exc.message) from exc
    signal.signal(signal.SIGTERM, _stop)
    logger = log.get("agent")
    logger.info("agent.starting", mode=settings.mode, integration_bridge=settings.integration_bridge,
                metadata_bridge=settings.metadata_bridge, provider_cidr=settings.provider_cidr,
                host=key.host, haproxy_user=settings.haproxy_user if settings.mode == "haproxy" else None,
                next_hops=[str(hop) for hop in settings.metadata_next_hop])
    _warn(settings, key.host)
    try:
        runner.run()
    except ImdsError as exc:
        logger.error("agent.failed", error=exc.message)  # noqa: TRY400 - the message says it all
        raise SystemExit(1) from exc
    except KeyboardInterrupt:
        pass
