"""``imds serve``: the instance-facing listener and the admin API."""

from __future__ import annotations

import gc
import os
import socket
from typing import Any

import click

from imds import log
from imds.cli import servers
from imds.cli.listen import listen_addresses
from imds.cli.options import resolve, settings_options
from imds.config import SERVE, Settings
from imds.errors import ImdsError


def bind(host: str, port: int, *, hop_limit: int = 0) -> socket.socket:
    """A listening TCP socket (no Nagle); IPv6 sockets are v6-only so ``[::]`` and ``0.0.0.0`` coexist.

    ``hop_limit`` (1-255) sets the IP TTL / IPv6 hop limit that accepted connections
    inherit, so answers (IMDSv2 tokens included) die N hops away, as AWS's PUT hop limit
    intends. ASGI gives no per-response socket access, so it applies to every response.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit this on Linux. Without it, a response written as headers
    # then body stalls on Nagle + the client's delayed ACK (~40 ms per request).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        if hop_limit:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, hop_limit)
    elif hop_limit:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, hop_limit)
    try:
        # A zoned link-local address (fe80::a9fe:a9fe%eth0) needs its scope id in a 4-tuple.
        zoned = "%" in host
        sock.bind(socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)[0][4] if zoned else (host, port))
    except socket.gaierror as exc:
        sock.close()
        msg = f"cannot listen on {host}:{port}: {exc.strerror} (a zone is for link-local fe80:: addresses)"
        raise click.ClickException(msg) from exc
    except OSError as exc:
        sock.close()
        msg = f"cannot listen on {host}:{port}: {exc.strerror}"
        raise click.ClickException(msg) from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def run(settings: Settings) -> None:
    """Migrate if asked, bind every listen address, and serve until SIGINT/SIGTERM."""
    from imds.app import build_served_app  # noqa: PLC0415 - the app stack loads only when serving

    logger = log.get("serve")
    if settings.store.migrate and not settings.store.db.startswith("memory://"):
        from imds.services import schema  # noqa: PLC0415 - Alembic loads only when a database is used

        schema.upgrade(settings.store.db, data_dir=settings.store.data_dir)  # a typo in --db is no new database
        logger.info("db.migrated", db=settings.store.db.split(":", 1)[0])
    servers.quiet_server_floods()
    listen = listen_addresses(settings)
    sockets = [bind(host, port, hop_limit=settings.ec2.token_hop_limit) for host, port in listen]
    # The admin listeners get no token hop limit: an operator may be several hops away. They
    # come last: servers.connection_budget watches the instance listeners only.
    sockets += [bind(host, port) for host, port in settings.http.admin_listen]
    servers.raise_fd_limit(settings.http.max_connections * len(sockets))
    serves = "instances" if settings.http.admin_listen else "instances and admin API"
    for kind, addresses in ((serves, listen), ("admin API", settings.http.admin_listen)):
        for host, port in addresses:
            logger.info("listening", address=f"[{host}]:{port}" if ":" in host else f"{host}:{port}", serves=kind,
                        server=settings.http.server, workers=settings.http.workers)
    serve_with = servers.SERVERS[settings.http.server]

    def serve_one() -> None:
        serve_with(build_served_app(settings), sockets, settings)

    if settings.http.workers > 1:
        servers.run_workers(settings.http.workers, serve_one)
    else:
        serve_one()
        # Stopped: the interpreter's teardown would now run the cyclic GC over every object still
        # alive, several times (seconds on a loaded box, between the last log line and the exit).
        # Frozen objects are skipped; the process is about to exit, nothing needs collecting.
        gc.freeze()


@click.command()
@settings_options(hollow=True)
def serve(**flags: Any) -> None:
    """Serve instance metadata (all flavors) and the admin API.

    hollow-metadataservice's flags and METADATASERVICE_* variables are read too (docs/hollow.md).
    """
    settings = resolve(flags)
    log.configure(settings.logging.log_level)
    for note in SERVE.aliases_of(flags, os.environ).notes:
        log.get("serve").info("hollow.setting", note=note)
    try:
        run(settings)
    except ImdsError as exc:
        raise click.ClickException(exc.message) from exc
