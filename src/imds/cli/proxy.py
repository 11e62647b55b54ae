"""``imds proxy``: the per-host proxy that signs the calling VM's identity for ``imds serve``."""

from __future__ import annotations

from typing import Any

import click

from imds import log
from imds.cli.options import resolve_command, settings_options
from imds.cli.serve import bind
from imds.cli.servers import run_uvicorn
from imds.config import PROXY, PROXY_OPTIONS, ProxySettings
from imds.errors import ConfigError
from imds.proxy.forward import ForwardPolicy, ProxyApp
from imds.proxy.identify import Identifier
from imds.proxy.mapfile import MapIdentifier
from imds.proxy.upstream import tls_context
from imds.signing import signing_key


def identifier_for(settings: ProxySettings) -> Identifier:
    """The identification mode the settings ask for (one branch per mode)."""
    if settings.map is not None:
        return MapIdentifier(settings.map, poll_interval=settings.map_poll_interval, reload_on_sighup=True)
    if settings.inport and settings.ovsdb:
        from imds.agent.ovsdb import Ovsdb  # noqa: PLC0415 - OVS modules load only in this mode
        from imds.proxy.inport import InportIdentifier  # noqa: PLC0415

        return InportIdentifier(Ovsdb(settings.ovsdb), settings.integration_bridge)
    msg = "an identification mode is required: --map FILE, or --ovsdb unix:PATH --inport"
    raise ConfigError(msg)


def build(settings: ProxySettings) -> ProxyApp:
    """The proxy app for ``settings``; the key is read here, once, and never logged."""
    logger = log.get("proxy")
    key = signing_key(shared_secret_file=settings.shared_secret_file, host_key_file=settings.host_key_file,
                      host_name=settings.host_name)
    if key.host is None:
        logger.warning("proxy.shared_secret", mode="one secret for every host",
                       advice="sign with this host's own key: --host-key-file and --host-name")
    tls = None
    if settings.upstream.lower().startswith("https://"):
        tls = tls_context(ca_file=settings.upstream_ca_file, cert_file=settings.upstream_cert_file,
                          key_file=settings.upstream_key_file, insecure=settings.upstream_insecure)
        if settings.upstream_insecure:
            logger.warning("proxy.upstream_insecure", upstream=settings.upstream,
                           reason="--upstream-insecure: the upstream's certificate is not verified")
    return ProxyApp(identifier_for(settings), key, settings.fill(ForwardPolicy), tls=tls)


def run(settings: ProxySettings) -> None:
    """Bind every listen address and proxy until SIGINT/SIGTERM (SIGHUP reloads the map)."""
    import uvicorn  # noqa: PLC0415 - the server stack loads only when serving

    logger = log.get("proxy")
    app = build(settings)
    sockets = [bind(host, port) for host, port in settings.listen]
    config = uvicorn.Config(
        app,
        lifespan="on",
        log_config=None,
        access_log=False,
        proxy_headers=False,  # the socket peer is the identity; never rewrite it from headers
        server_header=False,
        date_header=False,  # the upstream's Date is passed through
    )
    for host, port in settings.listen:
        logger.info("listening", address=f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
                    upstream=settings.upstream)
    run_uvicorn(config, sockets, "imds proxy")


@click.command()
@settings_options(table=PROXY_OPTIONS)
def proxy(**flags: Any) -> None:
    """Per-host proxy: identify the calling VM, sign its id, forward to imds serve."""
    settings = resolve_command(PROXY, flags)
    log.configure(settings.log_level)  # httpx's line per forwarded request stays off (an access log)
    try:
        run(settings)
    except ConfigError as exc:
        raise click.ClickException(exc.message) from exc
